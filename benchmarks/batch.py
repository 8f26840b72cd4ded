"""Scenario `batch` (issue 5): one JSONL batch of N one-tool-turn jobs with an instant model
(2,000 in the full run): the time to admit it (POST /v1/batches answers, every line
validated and every job written), the time until it completes, jobs/s — and a chat message
submitted just after the batch, whose latency shows it is not queued behind it."""
from __future__ import annotations

import json
import time
from typing import Any

import requests

from benchmarks.harness import summary, uid

BATCH_POLL_S = 0.2
CHAT_CONTENT = "What is 6*7? Use the calculator. turns=1"


def batch_lines(n: int) -> str:
    tag = uid("b")
    return "\n".join(json.dumps({
        "platform": "api", "platform_user_id": f"{tag}-u{i % 50}",
        "platform_channel_id": f"{tag}-c{i}", "content": CHAT_CONTENT,
        "custom_id": f"line-{i}"}) for i in range(n)) + "\n"


def scenario_batch(ctx) -> dict[str, Any]:
    lab, n = ctx.lab, ctx.sizes.batch_lines
    lab.server.set_latency(0)
    http = requests.Session()
    http.headers["Authorization"] = f"Bearer {lab.key}"
    body = batch_lines(n)
    t0 = time.time()
    response = http.post(f"{lab.stack.base}/v1/batches", data=body, timeout=600,
                         headers={"Content-Type": "application/x-ndjson"})
    admitted_s = time.time() - t0
    if response.status_code != 202:
        raise RuntimeError(f"batch answered {response.status_code}: {response.text[:300]}")
    batch_id = response.json()["id"]
    chat = ctx.one_job()  # submitted right after the batch, on its own conversation
    chat_latency_s = chat["finished"] - chat["submitted"]
    batch_done_at_chat_end = http.get(f"{lab.stack.base}/v1/batches/{batch_id}",
                                      timeout=30).json()["counts"]
    deadline = time.time() + 60 + n * 0.5
    while True:
        batch = http.get(f"{lab.stack.base}/v1/batches/{batch_id}", timeout=30).json()
        if batch["status"] in ("completed", "cancelled"):
            break
        if time.time() > deadline:
            raise TimeoutError(f"batch {batch_id} did not end: {batch['counts']}")
        time.sleep(BATCH_POLL_S)
    completed_s = time.time() - t0
    results = http.get(f"{lab.stack.base}/v1/batches/{batch_id}/results", timeout=120)
    rows = [json.loads(line) for line in results.text.splitlines()]
    in_order = [r["custom_id"] for r in rows] == [f"line-{i}" for i in range(len(rows))]
    counts = batch["counts"]
    return {
        "lines": n, "max_concurrency": batch["max_concurrency"],
        "admit_s": round(admitted_s, 2), "complete_s": round(completed_s, 2),
        "jobs_per_s": round(counts["completed"] / completed_s, 2) if completed_s else None,
        "counts": counts, "results_in_request_order": in_order,
        "chat_latency": summary([chat_latency_s]),
        "chat_completed": chat.get("status") == "completed",
        "batch_finished_when_chat_ended": sum(batch_done_at_chat_end.get(k, 0) for k in
                                              ("completed", "failed", "cancelled")),
    }
