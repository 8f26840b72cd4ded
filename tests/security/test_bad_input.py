"""Bad input never becomes a 5xx, through the real stack: JSON nested 100, 1,000 and
100,000 deep in every JSON field and in JSONL, an oversize body, oversize headers, query
parameters a route does not take. Each answers a 4xx in the API's error shape, naming the
problem, and writes nothing."""
from __future__ import annotations

import json
import socket
import uuid

import pytest
from sqlalchemy import func, select

from agentq.keys import lookup
from agentq.models import Batch, Job, Schedule, Tenant
from tests.support.api import Client, uid

pytestmark = pytest.mark.integration
DEPTHS = (100, 1_000, 100_000)


@pytest.fixture(scope="module")
def careless(stack):
    """A key of its own, so that what it wrote can be counted."""
    key = stack.create_key("careless", admin=True)
    with stack.sessions()() as session:
        key_id = lookup(session, key).id
    return Client(stack, key), key_id


def written(stack, key_id) -> tuple[int, int, int, int]:
    with stack.sessions()() as session:
        jobs = session.execute(select(func.count()).select_from(Job)
                               .where(Job.api_key_id == key_id)).scalar_one()
        batches = session.execute(select(func.count()).select_from(Batch)
                                  .where(Batch.api_key_id == key_id)).scalar_one()
        tenants = session.execute(select(func.count()).select_from(Tenant)).scalar_one()
        schedules = session.execute(select(func.count()).select_from(Schedule)).scalar_one()
    return jobs, batches, tenants, schedules


def nested(depth: int):
    """`depth` arrays, one inside the other, as raw JSON text."""
    return "[" * depth + "]" * depth


def message(**extra) -> dict:
    return {"platform": "api", "platform_user_id": uid("u"), "platform_channel_id": uid("c"),
            "content": "hi", **extra}


def with_raw(body: dict, field: str, depth: int) -> str:
    """`body` as JSON text with `field` (a dotted path) replaced by the nested arrays."""
    marker = "\"__NESTED__\""
    target, *rest = field.split(".")
    copy = json.loads(json.dumps(body))
    holder = copy
    for part in [target, *rest][:-1]:
        holder = holder[int(part)] if isinstance(holder, list) else holder[part]
    last = [target, *rest][-1]
    if isinstance(holder, list):
        holder[int(last)] = "__NESTED__"
    else:
        holder[last] = "__NESTED__"
    return json.dumps(copy).replace(marker, nested(depth))


def assert_refused(response, status=None, code=None) -> dict:
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:500])
    if status is not None:
        assert response.status_code == status, response.text[:500]
    error = response.json()["error"]
    assert set(error) == {"code", "message", "details"} and error["message"]
    if code is not None:
        assert error["code"] == code, error
    return error


LIMITS = {"max_iterations": 3, "max_tokens": 1000, "max_seconds": 30}
SCHEDULE = {"conversation_id": str(uuid.uuid4()), "content": "x", "delay_s": 60}
JSON_CASES = [
    ("/v1/messages", message(), "metadata"),
    ("/v1/messages", message(limits=LIMITS), "limits"),
    ("/v1/messages", message(limits=LIMITS), "limits.max_iterations"),
    ("/v1/messages", message(limits=LIMITS), "limits.max_seconds"),
    ("/v1/messages", message(callback_url="http://127.0.0.1:9/h"), "callback_url"),
    ("/v1/messages", message(on_busy="queue"), "on_busy"),
    ("/v1/messages", message(persona_id=None), "persona_id"),
    ("/v1/messages", message(stream=False), "stream"),
    ("/v1/messages", message(), "content"),
    ("/v1/messages", message(), "attachments"),
    ("/v1/messages", message(), "platform_user_id"),
    ("/v1/continue", {"conversation_id": str(uuid.uuid4()), "content": "x"}, "metadata"),
    ("/v1/continue", {"conversation_id": str(uuid.uuid4()), "content": "x"}, "content"),
    ("/v1/continue", {"conversation_id": str(uuid.uuid4()), "content": "x",
                      "limits": LIMITS}, "limits.max_tokens"),
    ("/v1/continue", {"conversation_id": str(uuid.uuid4()), "content": "x",
                      "callback_url": "http://127.0.0.1:9/h"}, "callback_url"),
    ("/v1/batches", {"requests": [message()]}, "requests"),
    ("/v1/batches", {"requests": [message()]}, "requests.0"),
    ("/v1/batches", {"requests": [message(metadata={})]}, "requests.0.metadata"),
    ("/v1/batches", {"requests": [message()], "metadata": {}}, "metadata"),
    ("/v1/batches", {"requests": [message(limits=LIMITS)]}, "requests.0.limits"),
    ("/v1/batches", {"requests": [message(callback_url="http://127.0.0.1:9/h")]},
     "requests.0.callback_url"),
    ("/v1/batches", {"requests": [message()], "callback_url": "http://127.0.0.1:9/h"},
     "callback_url"),
    ("/v1/batches", {"requests": [message()], "max_concurrency": 2}, "max_concurrency"),
    ("/v1/schedules", SCHEDULE, "conversation_id"),
    ("/v1/schedules", SCHEDULE, "content"),
    ("/v1/schedules", SCHEDULE, "delay_s"),
    ("/v1/schedules", {**SCHEDULE, "metadata": {}}, "metadata"),
    ("/v1/schedules", {**SCHEDULE, "callback_url": "http://127.0.0.1:9/h"}, "callback_url"),
    ("/v1/schedules", {"conversation_id": SCHEDULE["conversation_id"], "content": "x",
                       "cron": "* * * * *", "timezone": "UTC"}, "cron"),
    ("/v1/schedules", {"conversation_id": SCHEDULE["conversation_id"], "content": "x",
                       "cron": "* * * * *", "timezone": "UTC"}, "timezone"),
    ("/v1/batches/replay", {"job_ids": [str(uuid.uuid4())]}, "job_ids"),
    ("/v1/batches/replay", {"filter": {}}, "filter"),
    (f"/v1/jobs/{uuid.uuid4()}/replay", {"mode": "live"}, "model"),
    ("/v1/embed", {"text": "x"}, "text"),
    ("/v1/admin/tenants", {"name": "x"}, "name"),
    ("/v1/admin/keys", {"name": "x", "tenant_id": str(uuid.uuid4())}, "name"),
]


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize("path,body,field", JSON_CASES,
                         ids=[f"{p.split('/')[-1]}:{f}" for p, _b, f in JSON_CASES])
def test_nested_json_in_any_field_is_a_4xx_naming_the_depth(stack, careless, path, body,
                                                            field, depth):
    client, key_id = careless
    before = written(stack, key_id)
    response = client.post(path, data=with_raw(body, field, depth),
                           headers={"Content-Type": "application/json"})
    error = assert_refused(response, 400, "bad_json")
    assert "nested deeper than" in error["message"]
    assert written(stack, key_id) == before


@pytest.mark.parametrize("depth", DEPTHS)
def test_nested_json_as_the_whole_body_or_a_jsonl_line_is_a_4xx(stack, careless, depth):
    client, key_id = careless
    before = written(stack, key_id)
    assert_refused(client.post("/v1/messages", data=nested(depth),
                               headers={"Content-Type": "application/json"}), 400, "bad_json")
    good = json.dumps(message())
    for lines in ([with_raw(message(), "metadata", depth)], [good, nested(depth)],
                  [good, "[" * depth]):
        response = client.post("/v1/batches", data="\n".join(lines),
                               headers={"Content-Type": "application/x-ndjson"})
        error = assert_refused(response, 400, "bad_json")
        assert error["message"].startswith(f"Line {len(lines)}")
    assert written(stack, key_id) == before


def test_a_shallow_but_wrong_body_still_gets_its_own_error(careless):
    client, _ = careless
    assert_refused(client.post("/v1/messages", data="{not json",
                               headers={"Content-Type": "application/json"}), 400, "bad_json")
    assert_refused(client.post("/v1/messages", json=message(content=[[["x"]]])), 422,
                   "validation_error")


def raw_request(stack, head: str, body: bytes = b"") -> tuple[int, dict, bytes]:
    """One HTTP/1.1 request on a socket (a body that is never sent in full)."""
    with socket.create_connection(("127.0.0.1", stack.port), timeout=30) as sock:
        sock.sendall(head.encode() + b"\r\n" + body)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        header, _, rest = data.partition(b"\r\n\r\n")
        lines = header.decode().split("\r\n")
        headers = dict(line.split(": ", 1) for line in lines[1:])
        length = int(headers.get("Content-Length", "0"))
        while len(rest) < length:
            chunk = sock.recv(65536)
            if not chunk:
                break
            rest += chunk
        return int(lines[0].split()[1]), headers, rest


def test_an_oversize_body_is_refused_unread_with_413(stack, careless):
    client, key_id = careless
    key = client.http.headers["Authorization"]
    limit = stack.settings().front.max_body_bytes
    before = written(stack, key_id)
    status, headers, body = raw_request(stack, (
        f"POST /v1/messages HTTP/1.1\r\nHost: x\r\nAuthorization: {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {limit + 1}\r\n"
        "Connection: close\r\n"), b'{"metadata": ')
    assert status == 413
    assert json.loads(body)["error"]["code"] == "payload_too_large"
    assert written(stack, key_id) == before


def test_an_oversize_header_gets_the_error_shape_not_gunicorns_page(stack, careless):
    client, key_id = careless
    before = written(stack, key_id)
    for size in (300, 9_000, 60_000):
        response = client.post("/v1/messages", json=message(),
                               headers={"Idempotency-Key": "k" * size})
        if size <= stack.settings().front.max_header_bytes:
            assert_refused(response, 422, "validation_error")
        else:
            error = assert_refused(response, 431, "header_too_large")
            assert error["details"]["header"] == "Idempotency-Key"
    response = client.get(f"/v1/jobs/{uuid.uuid4()}", headers={"X-Junk": "j" * 20_000})
    assert_refused(response, 431, "header_too_large")
    assert written(stack, key_id) == before


@pytest.mark.parametrize("case", ["100 KiB header", "120 headers", "200 headers",
                                  "16 KiB URL", "16 KiB URL with a body"])
def test_oversize_heads_get_the_error_shape_whoever_refuses_them(stack, careless, case):
    """Issue 9: what gunicorn refused itself got its HTML page. The app refuses what it
    can see (a long header, too many headers, naming them); gunicorn's own refusals (a
    request line over 8190 bytes, a head past its larger limits) are in the same shape."""
    client, key_id = careless
    before = written(stack, key_id)
    headers = {"Content-Type": "application/json"}
    path = "/v1/messages"
    if case == "100 KiB header":
        headers["X-Padding"] = "p" * 100 * 1024
    elif case.endswith("headers"):
        headers.update({f"X-Extra-{i}": "1" for i in range(int(case.split()[0]))})
    else:
        path = "/v1/messages?" + "q=" + "u" * 16 * 1024
    response = client.post(path, data=json.dumps(message()) if "body" in case else b"{}",
                           headers=headers)
    assert response.headers["Content-Type"].startswith("application/json"), response.text
    if case == "100 KiB header":
        error = assert_refused(response, 431, "header_too_large")
        assert error["details"]["header"] == "X-Padding"
        assert error["details"]["size"] == 100 * 1024
    elif case == "120 headers":
        error = assert_refused(response, 431, "too_many_headers")
        assert error["details"]["limit"] == 100
    elif case == "200 headers":
        assert_refused(response, 431, "header_too_large")
    else:
        assert_refused(response, 414, "uri_too_long")
    assert written(stack, key_id) == before


def test_a_head_gunicorn_cannot_parse_gets_the_error_shape(stack, careless):
    client, key_id = careless
    before = written(stack, key_id)
    status, headers, body = raw_request(stack, "GET /v1/jobs HTTP/1.1\r\nHost: x\r\n"
                                               "Bad Header Name: 1\r\n")
    assert status == 400 and headers["Content-Type"] == "application/json"
    error = json.loads(body)["error"]
    assert error["code"] == "bad_request" and error["message"] and error["details"] == {}
    assert written(stack, key_id) == before


def test_query_parameters_a_route_does_not_take_are_refused(stack, careless):
    client, key_id = careless
    before = written(stack, key_id)
    # a JSON batch says its options in its body; in the query string they are refused
    response = client.post("/v1/batches", params={"callback_url": "http://127.0.0.1:9/h",
                                                  "max_concurrency": "5"},
                           json={"requests": [message()]})
    error = assert_refused(response, 400, "unknown_query_parameter")
    assert set(error["details"]["parameters"]) == {"callback_url", "max_concurrency"}
    error = assert_refused(client.post("/v1/messages", params={"wiat": "5"}, json=message()),
                           400, "unknown_query_parameter")
    assert error["details"] == {"parameters": ["wiat"], "allowed": ["wait"]}
    assert_refused(client.get(f"/v1/jobs/{uuid.uuid4()}", params={"after": "1"}), 400,
                   "unknown_query_parameter")
    assert_refused(client.get("/health", params={"x": "1"}), 400, "unknown_query_parameter")
    assert written(stack, key_id) == before
