"""agentq behind PgBouncer in transaction mode, with its defaults: statements are prepared on
their second run on a connection (AGENTQ_DB_PREPARE_THRESHOLD=2; the README says to set 0
behind such a pooler). A client connection's transactions move between PgBouncer's server
connections, where its prepared statements do not exist: such a connection sends the
statement again whole when it opened its transaction, else fails it once as a database
blip (a task retried, an API answer 503), and stops preparing (agentq/prepared.py). What a
user sees: every job completes and no answer is a 500; agentq's own client (which resends a
503 after its Retry-After) gets every answer. The model answers from the conversation,
statelessly, so a step re-run after a failed claim is answered as the first try was."""
from __future__ import annotations

import httpx
import pytest
from sqlalchemy.engine import make_url

from agentq.client import AgentQ
from agentq.testing.scripted_llm import ScriptedLLM, react_responder
from tests.support.api import TEST_ENV, uid
from tests.support.services import PgBouncer, require_pgbouncer
from tests.support.stack import own_stack

pytestmark = pytest.mark.integration

JOBS = 12


@pytest.fixture(scope="module")
def pooled(servers_up, tmp_path_factory):
    require_pgbouncer()
    with PgBouncer(pool_size=3) as bouncer, \
            ScriptedLLM(responder=react_responder()) as llm, \
            own_stack("pgbouncer", llm.base_url, tmp_path_factory.mktemp("pgbouncer"),
                      TEST_ENV, beat=True,
                      database_via=lambda url: bouncer.url(make_url(url).database)) as stack:
        yield stack, stack.create_key("pgbouncer", admin=True)


def test_every_job_completes_behind_a_transaction_pooler_with_the_defaults(pooled):
    stack, key = pooled
    unavailable = []
    http = httpx.Client(base_url=stack.base, timeout=httpx.Timeout(70.0, connect=5.0),
                        event_hooks={"response": [lambda r: unavailable.append(r.url)
                                                  if r.status_code == 503 else None]})
    with AgentQ(stack.base, api_key=key, attempts=10, http=http) as client:
        ids = [client.submit("What is 6*7? Use the calculator.", user=uid("u"),
                             channel=uid("c"), idempotency_key=uid("k")).id
               for _ in range(JOBS)]
        jobs = [client.wait(job_id, timeout_s=120) for job_id in ids]
    assert [(j.status, j.finish_reason) for j in jobs] == [("completed", "end_turn")] * JOBS
    assert {j.content for j in jobs} == {"The answer is 42."}
    logs = "".join(path.read_text(errors="replace") for path in stack.logs.values())
    print(f"503s resent: {len(unavailable)}; connections that stopped preparing: "
          f"{logs.count('preparing stops on it')}")
