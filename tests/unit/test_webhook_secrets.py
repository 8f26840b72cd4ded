"""agentq.webhooks.secrets on SQLite: which secrets sign a tenant's events, before and after a
rotation, and when the previous one stops (the stack's tests: tests/security/
test_tenant_edges.py)."""
from __future__ import annotations

from datetime import timedelta

import pytest

from agentq.config import Settings
from agentq.db import dispose_engines, session_scope, utcnow
from agentq.models import Tenant
from agentq.tenants import DEFAULT_TENANT_ID, create_tenant
from agentq.webhooks import secrets
from tests.support import unit_db

SETTING = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SETTING_NEXT = "whsec_c29tZS1vdGhlci1zZWNyZXQtbm90LXRoZS1tb2R1bGU="


@pytest.fixture(autouse=True)
def _engines():
    yield
    dispose_engines()


@pytest.fixture
def settings(tmp_path) -> Settings:
    settings = unit_db.settings({"AGENTQ_HOME": str(tmp_path),
                                 "AGENTQ_WEBHOOK_SECRET": f"{SETTING} {SETTING_NEXT}"})
    return settings


def signing(session, tenant_id, settings, now=None):
    return secrets.signing_secrets(session, session.get(Tenant, tenant_id), settings, now)


def test_the_default_tenant_signs_with_the_setting_until_it_rotates(settings):
    with session_scope(settings) as session:
        assert signing(session, DEFAULT_TENANT_ID, settings) == \
            (SETTING, SETTING_NEXT)
        new = secrets.rotate(session, DEFAULT_TENANT_ID, settings)
    now = utcnow()
    with session_scope(settings) as session:
        # the new one first, the setting's still signing for a day, then no more
        assert signing(session, DEFAULT_TENANT_ID, settings, now) == \
            (new, SETTING, SETTING_NEXT)
        later = now + secrets.ROTATION_OVERLAP + timedelta(seconds=1)
        assert signing(session, DEFAULT_TENANT_ID, settings, later) == (new,)


def test_another_tenant_gets_a_secret_of_its_own_once(settings):
    with session_scope(settings) as session:
        tenant = create_tenant(session, "other").id
    with session_scope(settings) as session:
        first = signing(session, tenant, settings)
    with session_scope(settings) as session:
        assert signing(session, tenant, settings) == first
    assert len(first) == 1 and first[0].startswith("whsec_")
    assert SETTING not in first and SETTING_NEXT not in first
    with session_scope(settings) as session:
        new = secrets.rotate(session, tenant, settings)
        newer = secrets.rotate(session, tenant, settings)
    with session_scope(settings) as session:
        # a second rotation keeps the one just before it; the first is gone
        assert signing(session, tenant, settings) == (newer, new)
    assert len({first[0], new, newer}) == 3
