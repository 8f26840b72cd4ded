"""A front that slow clients cannot stop (issue 30; docs/security.md, "The web front"),
through the real gunicorn web process (gevent workers, gunicorn.conf.py):

* /health answers while 200 connections that sent half a request head and 40 event streams
  and `?wait` answers of one key are all open (with gthread's threads, 100 such connections
  kept it from answering for as long as they were held);
* past a key's `streams_per_key`, a stream or a wait is a 429 `rate_limited` with
  Retry-After, and nothing is done; the slots come back when the job ends, and when a
  stream's client goes away;
* past a key's `requests_per_second` (its tenant's quota, as an operator set it), a 429 in
  the error shape with Retry-After; another key is not slowed by it;
* a head that never arrives whole is closed (AGENTQ_HEADER_TIMEOUT_S), a body that never
  arrives whole is a 408 (AGENTQ_BODY_TIMEOUT_S).
"""
from __future__ import annotations

import json
import select as io_select
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
import requests
from sqlalchemy import func, select

from agentq.models import Job
from agentq.testing.scripted_llm import text
from tests.support.api import TEST_ENV, wait_until
from tests.support.stack import own_stack

pytestmark = pytest.mark.integration

HOLDS = 40
HALF_OPEN = 200
GENEROUS_S = 60


@pytest.fixture(scope="module")
def front(servers_up, llm, tmp_path_factory):
    """A stack of its own whose keys may hold 40 streams and waits, with a long header
    timeout (so that the half-open connections stay open for as long as the test looks)
    and a short body timeout."""
    env = {**TEST_ENV, "AGENTQ_QUOTA_STREAMS_PER_KEY": str(HOLDS),
           "AGENTQ_HEADER_TIMEOUT_S": "600", "AGENTQ_BODY_TIMEOUT_S": "2"}
    with own_stack("front", llm.base_url, tmp_path_factory.mktemp("front"), env) as stack:
        yield stack


@pytest.fixture()
def gate():
    event = threading.Event()
    yield event
    event.set()


def held_reply(content: str, gate: threading.Event):
    reply = text(content)
    reply.hold = gate
    return reply


class Api:
    def __init__(self, stack, key: str):
        self.stack, self.key = stack, key
        self.http = requests.Session()
        self.http.headers["Authorization"] = f"Bearer {key}"

    def get(self, path: str, **kw) -> requests.Response:
        return self.http.get(self.stack.base + path, timeout=GENEROUS_S, **kw)

    def post(self, path: str, **kw) -> requests.Response:
        return self.http.post(self.stack.base + path, timeout=GENEROUS_S, **kw)

    def submit(self, content: str, **params) -> requests.Response:
        return self.post("/v1/messages", params=params, json={
            "platform": "api", "platform_user_id": "front-user",
            "platform_channel_id": f"front-{time.monotonic_ns()}", "content": content})

    def raw(self, path: str, accept: str = "application/json") -> socket.socket:
        """A request sent on a socket of its own, its answer left to be read."""
        sock = socket.create_connection(("127.0.0.1", self.stack.port), timeout=GENEROUS_S)
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: {accept}\r\n"
                     f"Authorization: Bearer {self.key}\r\n\r\n".encode())
        return sock

    def stream(self, job_id: str) -> socket.socket:
        """An event stream of the job, its answer's head read: 200."""
        sock = self.raw(f"/v1/jobs/{job_id}/events", "text/event-stream")
        head = read_until(sock, b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        return sock


def read_until(sock: socket.socket, marker: bytes) -> bytes:
    data = b""
    while marker not in data:
        chunk = sock.recv(65536)
        assert chunk, f"closed before {marker!r}: {data[-500:]!r}"
        data += chunk
    return data


def read_response(sock: socket.socket) -> tuple[bytes, dict]:
    """A whole JSON answer: its status line and its body."""
    data = read_until(sock, b"\r\n\r\n")
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(next(line.split(b":", 1)[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"closed in the body: {body!r}"
        body += chunk
    return head.split(b"\r\n", 1)[0], json.loads(body)


def still_open(sock: socket.socket) -> bool:
    """Open, and nothing was answered on it."""
    readable, _, _ = io_select.select([sock], [], [], 0)
    return not readable


def half_open(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=GENEROUS_S)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: sl")
    return sock


def holds_open(stack, key_id: str) -> int:
    """The key's slots taken (a place to wait for, not an outcome)."""
    client = redis.Redis.from_url(stack.env["AGENTQ_BROKER_URL"])
    try:
        return client.zcount(f"agentq:holds:{key_id}", time.time(), "+inf")
    finally:
        client.close()


def key_id(stack, key: str) -> str:
    from agentq.keys import hash_key
    from agentq.models import ApiKey
    with stack.sessions()() as session:
        return str(session.execute(select(ApiKey.id).where(
            ApiKey.key_hash == hash_key(key))).scalar_one())


def assert_rate_limited(response: requests.Response, limit: str) -> dict:
    assert response.status_code == 429, response.text
    error = response.json()["error"]
    assert error["code"] == "rate_limited" and error["details"]["limit"] == limit, error
    retry_after = response.headers["Retry-After"]
    assert retry_after.isdigit() and int(retry_after) >= 1, retry_after
    assert error["details"]["retry_after_s"] == int(retry_after)
    return error


def jobs_written(stack) -> int:
    with stack.sessions()() as session:
        return session.execute(select(func.count()).select_from(Job)).scalar_one()


def test_health_answers_while_slow_clients_and_held_streams_are_open(front, script, gate):
    api = Api(front, front.create_key("holder", admin=False))
    marker = script([held_reply("done at last", gate)])
    job = api.submit(f"{marker} think long").json()
    # given 20 event streams and 20 `?wait=60` answers of one key, all held open
    streams, waits, slow = [], [], []
    try:
        streams += [api.stream(job["id"]) for _ in range(HOLDS // 2)]
        waits += [api.raw(f"/v1/jobs/{job['id']}?wait=60") for _ in range(HOLDS // 2)]
        holder = key_id(front, api.key)
        wait_until(lambda: holds_open(front, holder) == HOLDS, what="every hold taken")
        # and 200 connections that sent half a request head
        slow += [half_open(front.port) for _ in range(HALF_OPEN)]
        # when anyone asks for /health, it answers
        health = requests.get(f"{front.base}/health", timeout=GENEROUS_S)
        assert health.status_code == 200 and health.json() == {"status": "ok"}
        # while every one of them was still open, and no wait had been answered
        assert all(still_open(s) for s in slow)
        assert all(still_open(s) for s in waits)

        # the key's 41st hold is refused, whatever asks for it, and a refused submit wrote
        # no job; a request that holds nothing is answered as usual
        assert_rate_limited(api.get(f"/v1/jobs/{job['id']}", params={"wait": 5}),
                            "streams_per_key")
        assert_rate_limited(api.get(f"/v1/jobs/{job['id']}/events",
                                    headers={"Accept": "text/event-stream"}),
                            "streams_per_key")
        before = jobs_written(front)
        refused = api.submit("never written", wait=5)
        error = assert_rate_limited(refused, "streams_per_key")
        assert error["details"]["quota"] == HOLDS
        assert jobs_written(front) == before
        assert api.get(f"/v1/jobs/{job['id']}").json()["status"] in ("queued", "running")
        for sock in slow:
            sock.close()

        # when the job ends, every stream gets its end and every wait its answer
        gate.set()
        for sock in streams:
            assert b"event: job_end" in read_until(sock, b"event: job_end")
        for sock in waits:
            status, body = read_response(sock)
            assert status.startswith(b"HTTP/1.1 200") and body["status"] == "completed", body
    finally:
        gate.set()
        for sock in slow + streams + waits:
            sock.close()
    # and the key's slots are free again
    assert api.get(f"/v1/jobs/{job['id']}", params={"wait": 1}).status_code == 200


def test_a_stream_whose_client_went_away_gives_its_slot_back(front, script, gate):
    api = Api(front, front.create_key("leaver", admin=False))
    marker = script([held_reply("finally", gate)])
    job = api.submit(f"{marker} think long").json()
    streams = []
    try:
        streams += [api.stream(job["id"]) for _ in range(HOLDS)]
        assert_rate_limited(api.get(f"/v1/jobs/{job['id']}", params={"wait": 1}),
                            "streams_per_key")
        # when one stream's client goes away (the job still running, no other stream ending)
        gone = streams.pop()
        gone.close()
        # then its slot is given back: a new hold is let in
        wait_until(lambda: api.get(f"/v1/jobs/{job['id']}",
                                   params={"wait": 0.1}).status_code == 200,
                   timeout_s=120, every_s=1, what="the gone client's slot given back")
        # while the job still runs: no other stream had ended
        assert api.get(f"/v1/jobs/{job['id']}").json()["status"] in ("queued", "running")
    finally:
        gate.set()
        for sock in streams:
            sock.close()
    assert api.get(f"/v1/jobs/{job['id']}", params={"wait": 30}).json()["status"] == \
        "completed"


def test_requests_past_the_tenants_rate_are_refused_with_retry_after(front):
    # given a tenant an operator allowed 3 requests a second per key
    from agentq.db import session_scope
    from agentq.tenants import find_tenant, update_quotas
    tenant_id = front.create_tenant(f"slow-{time.monotonic_ns()}")
    with session_scope(front.settings()) as session:
        update_quotas(session, find_tenant(session, tenant_id), {"requests_per_second": 3})
    limited = Api(front, front.create_key("limited", admin=False, tenant=tenant_id))
    other = Api(front, front.create_key("other", admin=False))
    missing = "/v1/jobs/00000000-0000-0000-0000-00000000abcd"
    # when its key asks faster than that: 20 requests sent at once (one after another,
    # a loaded machine could answer them slower than the rate)
    with ThreadPoolExecutor(max_workers=20) as pool:
        answers = list(pool.map(lambda _: requests.get(
            front.base + missing, headers={"Authorization": f"Bearer {limited.key}"},
            timeout=GENEROUS_S), range(20)))
    # then the requests past the rate are refused in the error shape, with Retry-After
    refused = [r for r in answers if r.status_code == 429]
    assert refused and {r.status_code for r in answers} <= {404, 429}
    error = assert_rate_limited(refused[0], "requests_per_second")
    assert error["details"]["quota"] == 3
    # another key is not slowed by it
    assert other.get(missing).status_code == 404
    # and after the wait it asked for, the key is let in again
    time.sleep(int(refused[-1].headers["Retry-After"]))
    wait_until(lambda: limited.get(missing).status_code == 404, every_s=1,
               what="the key let in again")


def test_a_body_that_never_arrives_whole_is_a_408(front):
    sock = socket.create_connection(("127.0.0.1", front.port), timeout=GENEROUS_S)
    try:
        sock.sendall(b"POST /v1/messages HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"pla")
        status, body = read_response(sock)
    finally:
        sock.close()
    assert status.startswith(b"HTTP/1.1 408"), body
    error = body["error"]
    assert error["code"] == "request_timeout" and error["details"] == {"timeout_s": 2}


def test_a_head_that_never_arrives_whole_is_closed(stack):
    # the session's stack, with the default header timeout (AGENTQ_HEADER_TIMEOUT_S, 20 s,
    # up to 30 s spread)
    sock = half_open(stack.port)
    try:
        sock.settimeout(2 * GENEROUS_S)
        assert sock.recv(1024) == b""  # closed by the server, unanswered
    finally:
        sock.close()


@pytest.mark.parametrize("kind", ["redis", "memory"])
def test_the_slots_of_a_process_that_died_holding_them_come_back(servers_up, kind):
    from api.ratelimit import Hold, MemoryHolds, RedisHolds
    from tests.support.stack import worker_redis_url
    holds = RedisHolds(worker_redis_url()) if kind == "redis" else MemoryHolds()
    key = f"agentq:holds:test-{time.monotonic_ns()}"
    # given a key's two slots taken, their leases running: no third is let in
    held = [Hold(holds, key, f"held-{i}", lease_s=GENEROUS_S) for i in range(2)]
    assert all(holds.acquire(hold, limit=2) for hold in held)
    assert not holds.acquire(Hold(holds, key, "early", lease_s=GENEROUS_S), limit=2)
    for hold in held:
        hold.release()
    # given a key's two slots taken by a web process that then died (never released), their
    # leases run out (a lease of 0: ended when taken, no clock to wait for)
    dead = [Hold(holds, key, f"dead-{i}", lease_s=0.0) for i in range(2)]
    assert all(holds.acquire(hold, limit=2) for hold in dead)
    # then a third is let in, and theirs are gone
    late = Hold(holds, key, "late", lease_s=GENEROUS_S)
    assert holds.acquire(late, limit=2)
    assert holds.count(key) == 1
    late.release()
    assert holds.count(key) == 0
