"""Schemathesis hooks for tests/integration/test_openapi.py (loaded through
SCHEMATHESIS_HOOKS=tests.support.schemathesis_hooks in the `schemathesis run` subprocess).

They keep generated requests valid or invalid as generated, while bounding what they cost
and where they reach:
- every http(s) `callback_url` (body, batch lines, query) points at a closed loopback port,
  so no webhook leaves the machine;
- a batch carries at most MAX_BATCH requests (the schema allows 10,000 a batch);
- a replay batch's `filter` is pinned to the time window in AGENTQ_ST_REPLAY_WINDOW
  ("since,until": the test's one seed job), so it replays at most that job, not every job in
  the database; `job_ids` lists are cut to MAX_BATCH;
- `wait` is cut to MAX_WAIT_S seconds (the schema allows 60: a minute per request whenever a
  generated job queues behind others in the one conversation schemathesis' ids all share);
- an Idempotency-Key is made unique per body (schemathesis reuses "0" with many bodies,
  which the API rightly answers 422, hiding everything else the operation does);
- a key revoke or rotation reaches only keys this run made (schemathesis reuses ids it read from
  GET /v1/admin/keys, and would revoke the other tests' keys, or its own); any other id is
  replaced by a fresh one, a 404.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import uuid
from typing import Any

import schemathesis

CALLBACK = "http://127.0.0.1:9/hook"
MAX_BATCH = 3
MAX_WAIT_S = 2
MAX_KEY = 255
_HTTP = re.compile(r"(?i)^https?://")
REVOKE = "/v1/admin/keys/{key_id}/revoke"
ROTATE = "/v1/admin/keys/{key_id}/rotate"
_made_keys: set[str] = set()


def _pin_callbacks(value: Any) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "callback_url" and isinstance(item, str) and _HTTP.match(item):
                value[key] = CALLBACK
            else:
                _pin_callbacks(item)
    elif isinstance(value, list):
        for item in value:
            _pin_callbacks(item)


@schemathesis.hook
def before_call(ctx, case, **kwargs):
    path, method = case.operation.path, case.method.upper()
    body = case.body
    _pin_callbacks(body)
    if isinstance(case.query, dict):
        _pin_callbacks(case.query)
        wait = case.query.get("wait")
        if isinstance(wait, (int, float)) and not isinstance(wait, bool) and wait > MAX_WAIT_S:
            case.query["wait"] = MAX_WAIT_S
    if method == "POST" and path == "/v1/batches":
        if isinstance(body, dict) and isinstance(body.get("requests"), list):
            del body["requests"][MAX_BATCH:]
        elif isinstance(body, str):
            case.body = "\n".join(body.splitlines()[:MAX_BATCH])
    if method == "POST" and path == "/v1/batches/replay" and isinstance(body, dict):
        if isinstance(body.get("job_ids"), list):
            del body["job_ids"][MAX_BATCH:]
        if isinstance(body.get("filter"), dict):
            since, _, until = os.environ.get("AGENTQ_ST_REPLAY_WINDOW", "").partition(",")
            body["filter"]["since"], body["filter"]["until"] = since, until
    if method == "POST" and path in (REVOKE, ROTATE) and isinstance(case.path_parameters,
                                                                    dict):
        if case.path_parameters.get("key_id") not in _made_keys:
            case.path_parameters["key_id"] = str(uuid.uuid4())
    headers = case.headers
    key = headers.get("Idempotency-Key") if isinstance(headers, dict) else None
    if isinstance(key, str) and key.strip() and len(key) <= MAX_KEY:
        digest = hashlib.sha1(json.dumps(body, sort_keys=True, default=str)
                              .encode("utf-8", "surrogatepass")).hexdigest()[:16]
        headers["Idempotency-Key"] = key[:MAX_KEY - 17] + "-" + digest


@schemathesis.hook
def after_call(ctx, case, response):
    if (case.method.upper() == "POST" and case.operation.path in ("/v1/admin/keys", ROTATE)
            and response.status_code == 201):
        try:
            _made_keys.add(response.json()["id"])
        except (ValueError, KeyError, TypeError):
            pass
