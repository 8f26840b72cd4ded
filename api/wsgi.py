"""The web process's entry point: `gunicorn api.wsgi:app`."""
from agentq import logs
from agentq.config import get_settings
from api import create_app

logs.configure(get_settings().log_level)
app = create_app()
