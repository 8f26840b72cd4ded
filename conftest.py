"""The test session's own Postgres and Redis (tests/support/suite_servers.py), started here:
this conftest is imported first, before tests/conftest.py imports the stack helpers that
read their URLs; they are stopped when the session ends."""
from tests.support import suite_servers

suite_servers.start()


def pytest_unconfigure(config):
    suite_servers.stop()
