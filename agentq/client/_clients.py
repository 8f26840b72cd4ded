"""`AgentQ` (sync) and `AsyncAgentQ` (asyncio): the same calls on httpx, one sending each
`Call` that `_core` builds. Requests that are safe to send twice (GETs, submits with an
Idempotency-Key) are retried on a broken connection and on 502/503/504, honouring
`Retry-After`, by tenacity; nothing else is ever sent twice.

Event streams use httpx-sse and resume after the last seen event when the connection drops,
so a stream yields each event once, in order, until `job_end`.
"""
from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any, AsyncIterator, Iterable, Iterator, Mapping

import httpx
from httpx_sse import aconnect_sse, connect_sse
from tenacity import (
    AsyncRetrying,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential,
)

import agentq.client._core as _core
from agentq.client._core import (
    ApiError,
    Batch,
    BatchResult,
    Call,
    Delivery,
    Event,
    Job,
    Timeout,
    TransportError,
    Unavailable,
)

DEFAULT_URL = "http://127.0.0.1:5000"
SSE_READ_TIMEOUT_S = 45.0  # the API sends a keep-alive every 15 s
READY_TIMEOUT_S = 5.0  # a readiness probe is answered at once, or says enough by not


def _settings(url: str | None, api_key: str | None) -> tuple[str, str]:
    url = (url or os.environ.get("AGENTQ_URL") or DEFAULT_URL).rstrip("/")
    api_key = api_key or os.environ.get("AGENTQ_API_KEY")
    if not api_key:
        raise _core.AgentQError("no API key: pass api_key= or set AGENTQ_API_KEY")
    return url, api_key


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, TransportError) or (
        isinstance(exc, ApiError) and exc.status in _core.RETRY_STATUSES)


class _RetryAfter:
    """Wait what the server asked for (Retry-After), else back off exponentially."""

    def __init__(self):
        self.backoff = wait_exponential(multiplier=0.2, max=5)

    def __call__(self, state) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, ApiError) and exc.retry_after is not None:
            return min(exc.retry_after, 30.0)
        return self.backoff(state)


def _retry_kwargs(attempts: int) -> dict:
    return dict(retry=retry_if_exception(_retryable), stop=stop_after_attempt(attempts),
                wait=_RetryAfter(), reraise=True)


def _checked(response: httpx.Response) -> httpx.Response:
    if response.status_code >= 400:
        raise _core.error_from(response.status_code, response.headers, response.content,
                               response.request.method, response.request.url.path)
    return response


def _headers(api_key: str) -> dict:
    from importlib.metadata import PackageNotFoundError, version
    try:
        release = version("agentq")
    except PackageNotFoundError:
        release = "dev"
    return {"Authorization": f"Bearer {api_key}", "User-Agent": f"agentq-client/{release}"}


def verify_webhook(secret: str, body: bytes | str, headers: Mapping[str, str]
                   ) -> _core.WebhookEvent:
    """Check a webhook's Standard Webhooks signature and age (5 minutes) with the secret
    (`whsec_…`, the server's AGENTQ_WEBHOOK_SECRET); return the event, or raise
    `WebhookVerificationError`. Pass the body exactly as received."""
    from standardwebhooks import Webhook
    from standardwebhooks.webhooks import WebhookVerificationError as Invalid
    lowered = {k.lower(): v for k, v in headers.items()}
    try:
        payload = Webhook(secret).verify(body, lowered)
    except Invalid as exc:
        raise _core.WebhookVerificationError(str(exc)) from None
    if not isinstance(payload, dict):
        raise _core.WebhookVerificationError("the body is not a JSON object")
    return _core.parse_webhook(payload, lowered.get("webhook-id", ""))


class AgentQ:
    """The agentq API, synchronously.

        with AgentQ("http://127.0.0.1:5000", api_key=KEY) as aq:
            job = aq.submit("What is 6*7?", user="me", channel="c1")
            print(aq.wait(job.id).content)
    """

    def __init__(self, url: str | None = None, api_key: str | None = None, *,
                 timeout_s: float = 30.0, attempts: int = 4,
                 http: httpx.Client | None = None):
        self.url, api_key = _settings(url, api_key)
        self.attempts = attempts
        self.http = http or httpx.Client(base_url=self.url,
                                         timeout=httpx.Timeout(timeout_s, connect=5.0))
        self.http.headers.update(_headers(api_key))

    def __enter__(self) -> "AgentQ":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        self.http.close()

    # sending
    def _send_once(self, call: Call, timeout: httpx.Timeout | None = None) -> httpx.Response:
        try:
            response = self.http.request(
                call.method, call.path, json=call.json, params=call.params,
                headers=call.headers, content=call.content,
                timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT)
        except httpx.TransportError as exc:
            raise TransportError(f"{call.method} {self.url}{call.path}: {exc}") from exc
        return _checked(response)

    def _send(self, call: Call, timeout: httpx.Timeout | None = None) -> httpx.Response:
        if not call.retry_safe:
            return self._send_once(call, timeout)
        for attempt in Retrying(**_retry_kwargs(self.attempts)):
            with attempt:
                return self._send_once(call, timeout)
        raise AssertionError("unreachable")

    def _json(self, call: Call, timeout: httpx.Timeout | None = None) -> Any:
        return self._send(call, timeout).json()

    # jobs
    def submit(self, content: str, *, user: str, channel: str, **options: Any) -> Job:
        """POST /v1/messages. Options: platform, thread, server, attachments, callback_url,
        on_busy, metadata, idempotency_key (safe to retry then), wait_s, and any other
        field of the request body."""
        call = _core.message_call(content, user=user, channel=channel, **options)
        return Job.parse(self._json(call, _long(call)))

    def continue_(self, conversation_id: str, content: str, **options: Any) -> Job:
        return Job.parse(self._json(_core.continue_call(conversation_id, content, **options)))

    def job(self, job_id: str) -> Job:
        return Job.parse(self._json(_core.job_call(job_id)))

    def wait(self, job_id: str, timeout_s: float = 600.0) -> Job:
        """The job once it has ended; `Timeout` (holding the job as last seen) if it has not
        after timeout_s. Waits on the server (`?wait=`), not by polling in a tight loop."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            call = _core.job_call(job_id, wait_s=max(0.0, left))
            job = Job.parse(self._json(call, _long(call)))
            if job.ended:
                return job
            if time.monotonic() >= deadline:
                raise Timeout(job)

    def cancel(self, job_id: str) -> Job:
        return Job.parse(self._json(Call("POST", f"/v1/jobs/{job_id}/cancel")))

    def events(self, job_id: str, after: int = 0) -> list[Event]:
        """Events stored so far after seq `after` (all pages)."""
        events: list[Event] = []
        while True:
            page = self._json(_core.events_call(job_id, after))
            events.extend(Event.parse(e) for e in page["data"])
            if not page.get("has_more") or not page["data"]:
                return events
            after = events[-1].seq

    def stream(self, job_id: str, after: int = 0) -> Iterator[Event]:
        """Each event after seq `after` as it happens, until `job_end`; a dropped connection
        resumes after the last event seen (Last-Event-ID)."""
        failures = 0
        while True:
            headers = {"Last-Event-ID": str(after)} if after else {}
            try:
                with connect_sse(self.http, "GET", f"/v1/jobs/{job_id}/events",
                                 headers=headers, timeout=_sse_timeout()) as source:
                    if source.response.status_code >= 400:
                        source.response.read()
                        _checked(source.response)
                    for sse in source.iter_sse():
                        if not sse.data or sse.event == "message_delta":
                            continue  # streamed text pieces: not events of the record
                        event = Event.parse(json.loads(sse.data))
                        after, failures = event.seq, 0
                        yield event
                        if event.type == "job_end":
                            return
                return  # the server ended the stream: the job had ended before `after`
            except (httpx.TransportError, Unavailable) as exc:
                failures += 1
                if failures >= self.attempts:
                    raise TransportError(f"event stream of job {job_id}: {exc}") from exc
                time.sleep(min(2 ** failures * 0.2, 5))

    def watch(self, job_id: str, after: int = 0) -> Iterator[Event | None]:
        """One connection of the job's event stream: each stored event after seq `after` as
        it happens, and None whenever the stream shows life without one (a keep-alive, every
        15 s; a streamed text piece), until `job_end` or the server ends it. Nothing is
        resumed: a dropped connection raises `TransportError` (its cause: the transport's
        error) and the caller decides (`stream` resumes by itself)."""
        headers = {"Accept": "text/event-stream"}
        if after:
            headers["Last-Event-ID"] = str(after)
        path = f"/v1/jobs/{job_id}/events"
        try:
            with self.http.stream("GET", path, headers=headers,
                                  timeout=_sse_timeout()) as response:
                if response.status_code >= 400:
                    response.read()
                    _checked(response)
                for item in _core.sse_items(response.iter_lines()):
                    yield (Event.parse(item) if item is not None and item.get("seq") is not None
                           else None)
        except httpx.TransportError as exc:
            raise TransportError(f"GET {self.url}{path}: {exc}") from exc

    def replay(self, job_id: str, mode: str = "recorded", model: str | None = None) -> Job:
        return Job.parse(self._json(_core.replay_call(job_id, mode, model)))

    def compare(self, job_id: str) -> dict:
        """GET /v1/jobs/<id>/compare: a replay beside its original (answers, tool calls,
        usage), as the API sends it."""
        return self._json(Call("GET", f"/v1/jobs/{job_id}/compare", retry_safe=True))

    def down(self, timeout_s: float = READY_TIMEOUT_S) -> list[str]:
        """What GET /health/ready says is away (`database`, `broker`, `sandbox`); [] when
        it is ready."""
        try:
            response = self.http.get("/health/ready", timeout=timeout_s)
        except httpx.TransportError as exc:
            raise TransportError(f"GET {self.url}/health/ready: {exc}") from exc
        return _down_in(response)

    def deliveries(self, job_id: str) -> list[Delivery]:
        page = self._json(Call("GET", f"/v1/jobs/{job_id}/deliveries", retry_safe=True))
        return [Delivery.parse(d) for d in page["data"]]

    def messages(self, conversation_id: str) -> list[dict]:
        return self._json(Call("GET", f"/v1/conversations/{conversation_id}/messages",
                               retry_safe=True))["data"]

    # approvals (API.md 1.1)
    def approve(self, job_id: str, tool_use_id: str, arguments: dict | None = None) -> Job:
        """Run a tool call that waits for approval (with `arguments` instead of the
        model's, if given). 409 (Conflict) when that call is not waiting."""
        return Job.parse(self._json(_core.decision_call(job_id, tool_use_id, "approve",
                                                        {"arguments": arguments})))

    def deny(self, job_id: str, tool_use_id: str, reason: str | None = None) -> Job:
        """Refuse a tool call that waits for approval: the model reads a `denied` error."""
        return Job.parse(self._json(_core.decision_call(job_id, tool_use_id, "deny",
                                                        {"reason": reason})))

    # schedules (API.md 1.1): the schedule objects as the API sends them
    def create_schedule(self, conversation_id: str, content: str, **when: Any) -> dict:
        """`when`: run_at | delay_s | cron (+ timezone); callback_url, metadata."""
        return self._json(_core.schedule_call(conversation_id, content, **when))

    def schedule(self, schedule_id: str) -> dict:
        return self._json(Call("GET", f"/v1/schedules/{schedule_id}", retry_safe=True))

    def schedules(self, conversation_id: str | None = None, status: str | None = None,
                  limit: int | None = None) -> list[dict]:
        return self._json(_core.schedules_call(conversation_id, status, limit))["data"]

    def cancel_schedule(self, schedule_id: str) -> None:
        """DELETE /v1/schedules/<id> (204): it never fires again, and stays readable with
        `status: cancelled`."""
        self._send(Call("DELETE", f"/v1/schedules/{schedule_id}"))

    # batches
    def submit_batch(self, requests: Iterable[dict] | bytes, *,
                     callback_url: str | None = None,
                     max_concurrency: int | None = None) -> Batch:
        """Each request is a POST /v1/messages body (plus an optional custom_id); bytes: a
        JSONL body as it is."""
        return Batch.parse(self._json(_core.batch_call(requests, callback_url,
                                                       max_concurrency)))

    def batch(self, batch_id: str) -> Batch:
        return Batch.parse(self._json(Call("GET", f"/v1/batches/{batch_id}",
                                           retry_safe=True)))

    def wait_batch(self, batch_id: str, timeout_s: float = 3600.0,
                   poll_s: float = 1.0) -> Batch:
        deadline = time.monotonic() + timeout_s
        while True:
            batch = self.batch(batch_id)
            if batch.ended:
                return batch
            if time.monotonic() >= deadline:
                raise _core.AgentQError(f"batch {batch_id} still {batch.status}")
            time.sleep(poll_s)

    def batch_results(self, batch_id: str) -> Iterator[BatchResult]:
        """The batch's ended jobs so far, in request order."""
        yield from _core.results_lines(self.batch_result_lines(batch_id))

    def batch_result_lines(self, batch_id: str) -> Iterator[str]:
        """The batch's results as the API sends them: one job object's JSON a line."""
        path = f"/v1/batches/{batch_id}/results"
        try:
            with self.http.stream("GET", path) as response:
                if response.status_code >= 400:
                    response.read()
                    _checked(response)
                for line in response.iter_lines():
                    if line:
                        yield line
        except httpx.TransportError as exc:
            raise TransportError(f"GET {self.url}{path}: {exc}") from exc

    def cancel_batch(self, batch_id: str) -> Batch:
        return Batch.parse(self._json(Call("POST", f"/v1/batches/{batch_id}/cancel")))

    def replay_batch(self, *, job_ids: Iterable[str] | None = None,
                     filter: dict | None = None, mode: str = "recorded",
                     model: str | None = None) -> Batch:
        return Batch.parse(self._json(_core.replay_batch_call(job_ids, filter, mode, model)))


class AsyncAgentQ:
    """The agentq API on asyncio: the same methods as `AgentQ`, awaited; `stream` is an
    async iterator.

        async with AsyncAgentQ(url, api_key=KEY) as aq:
            job = await aq.submit("hi", user="me", channel="c1")
            async for event in aq.stream(job.id):
                print(event.type)
    """

    def __init__(self, url: str | None = None, api_key: str | None = None, *,
                 timeout_s: float = 30.0, attempts: int = 4,
                 http: httpx.AsyncClient | None = None):
        self.url, api_key = _settings(url, api_key)
        self.attempts = attempts
        self.http = http or httpx.AsyncClient(base_url=self.url,
                                              timeout=httpx.Timeout(timeout_s, connect=5.0))
        self.http.headers.update(_headers(api_key))

    async def __aenter__(self) -> "AsyncAgentQ":
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def close(self) -> None:
        await self.http.aclose()

    async def _send_once(self, call: Call, timeout: httpx.Timeout | None = None
                         ) -> httpx.Response:
        try:
            response = await self.http.request(
                call.method, call.path, json=call.json, params=call.params,
                headers=call.headers, content=call.content,
                timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT)
        except httpx.TransportError as exc:
            raise TransportError(f"{call.method} {self.url}{call.path}: {exc}") from exc
        return _checked(response)

    async def _send(self, call: Call, timeout: httpx.Timeout | None = None) -> httpx.Response:
        if not call.retry_safe:
            return await self._send_once(call, timeout)
        async for attempt in AsyncRetrying(**_retry_kwargs(self.attempts)):
            with attempt:
                return await self._send_once(call, timeout)
        raise AssertionError("unreachable")

    async def _json(self, call: Call, timeout: httpx.Timeout | None = None) -> Any:
        return (await self._send(call, timeout)).json()

    async def submit(self, content: str, *, user: str, channel: str, **options: Any) -> Job:
        call = _core.message_call(content, user=user, channel=channel, **options)
        return Job.parse(await self._json(call, _long(call)))

    async def continue_(self, conversation_id: str, content: str, **options: Any) -> Job:
        return Job.parse(await self._json(_core.continue_call(conversation_id, content,
                                                              **options)))

    async def job(self, job_id: str) -> Job:
        return Job.parse(await self._json(_core.job_call(job_id)))

    async def wait(self, job_id: str, timeout_s: float = 600.0) -> Job:
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            call = _core.job_call(job_id, wait_s=max(0.0, left))
            job = Job.parse(await self._json(call, _long(call)))
            if job.ended:
                return job
            if time.monotonic() >= deadline:
                raise Timeout(job)

    async def cancel(self, job_id: str) -> Job:
        return Job.parse(await self._json(Call("POST", f"/v1/jobs/{job_id}/cancel")))

    async def events(self, job_id: str, after: int = 0) -> list[Event]:
        events: list[Event] = []
        while True:
            page = await self._json(_core.events_call(job_id, after))
            events.extend(Event.parse(e) for e in page["data"])
            if not page.get("has_more") or not page["data"]:
                return events
            after = events[-1].seq

    async def stream(self, job_id: str, after: int = 0) -> AsyncIterator[Event]:
        failures = 0
        while True:
            headers = {"Last-Event-ID": str(after)} if after else {}
            try:
                async with aconnect_sse(self.http, "GET", f"/v1/jobs/{job_id}/events",
                                        headers=headers, timeout=_sse_timeout()) as source:
                    if source.response.status_code >= 400:
                        await source.response.aread()
                        _checked(source.response)
                    async for sse in source.aiter_sse():
                        if not sse.data or sse.event == "message_delta":
                            continue  # streamed text pieces: not events of the record
                        event = Event.parse(json.loads(sse.data))
                        after, failures = event.seq, 0
                        yield event
                        if event.type == "job_end":
                            return
                return
            except (httpx.TransportError, Unavailable) as exc:
                failures += 1
                if failures >= self.attempts:
                    raise TransportError(f"event stream of job {job_id}: {exc}") from exc
                await asyncio.sleep(min(2 ** failures * 0.2, 5))

    async def replay(self, job_id: str, mode: str = "recorded", model: str | None = None
                     ) -> Job:
        return Job.parse(await self._json(_core.replay_call(job_id, mode, model)))

    async def compare(self, job_id: str) -> dict:
        return await self._json(Call("GET", f"/v1/jobs/{job_id}/compare", retry_safe=True))

    async def down(self, timeout_s: float = READY_TIMEOUT_S) -> list[str]:
        try:
            response = await self.http.get("/health/ready", timeout=timeout_s)
        except httpx.TransportError as exc:
            raise TransportError(f"GET {self.url}/health/ready: {exc}") from exc
        return _down_in(response)

    async def deliveries(self, job_id: str) -> list[Delivery]:
        page = await self._json(Call("GET", f"/v1/jobs/{job_id}/deliveries", retry_safe=True))
        return [Delivery.parse(d) for d in page["data"]]

    async def approve(self, job_id: str, tool_use_id: str, arguments: dict | None = None
                      ) -> Job:
        return Job.parse(await self._json(_core.decision_call(
            job_id, tool_use_id, "approve", {"arguments": arguments})))

    async def deny(self, job_id: str, tool_use_id: str, reason: str | None = None) -> Job:
        return Job.parse(await self._json(_core.decision_call(
            job_id, tool_use_id, "deny", {"reason": reason})))

    async def create_schedule(self, conversation_id: str, content: str, **when: Any) -> dict:
        return await self._json(_core.schedule_call(conversation_id, content, **when))

    async def schedule(self, schedule_id: str) -> dict:
        return await self._json(Call("GET", f"/v1/schedules/{schedule_id}", retry_safe=True))

    async def schedules(self, conversation_id: str | None = None, status: str | None = None,
                        limit: int | None = None) -> list[dict]:
        return (await self._json(_core.schedules_call(conversation_id, status, limit)))["data"]

    async def cancel_schedule(self, schedule_id: str) -> None:
        await self._send(Call("DELETE", f"/v1/schedules/{schedule_id}"))

    async def submit_batch(self, requests: Iterable[dict] | bytes, *,
                           callback_url: str | None = None,
                           max_concurrency: int | None = None) -> Batch:
        return Batch.parse(await self._json(_core.batch_call(requests, callback_url,
                                                             max_concurrency)))

    async def batch(self, batch_id: str) -> Batch:
        return Batch.parse(await self._json(Call("GET", f"/v1/batches/{batch_id}",
                                                 retry_safe=True)))

    async def wait_batch(self, batch_id: str, timeout_s: float = 3600.0,
                         poll_s: float = 1.0) -> Batch:
        deadline = time.monotonic() + timeout_s
        while True:
            batch = await self.batch(batch_id)
            if batch.ended:
                return batch
            if time.monotonic() >= deadline:
                raise _core.AgentQError(f"batch {batch_id} still {batch.status}")
            await asyncio.sleep(poll_s)

    async def batch_results(self, batch_id: str) -> list[BatchResult]:
        response = await self.http.get(f"/v1/batches/{batch_id}/results")
        _checked(response)
        return list(_core.results_lines(response.text.splitlines()))

    async def cancel_batch(self, batch_id: str) -> Batch:
        return Batch.parse(await self._json(Call("POST", f"/v1/batches/{batch_id}/cancel")))

    async def replay_batch(self, *, job_ids: Iterable[str] | None = None,
                           filter: dict | None = None, mode: str = "recorded",
                           model: str | None = None) -> Batch:
        return Batch.parse(await self._json(_core.replay_batch_call(job_ids, filter, mode,
                                                                    model)))


def _down_in(response: httpx.Response) -> list[str]:
    """GET /health/ready's answer: the `down` of its 503, [] of a 200; any other answer (a
    503 not of that shape too) raises as every error does."""
    if response.status_code == 503:
        try:
            return [str(name) for name in response.json()["down"]]
        except (ValueError, KeyError, TypeError):
            pass
    _checked(response)
    return []


def _long(call: Call) -> httpx.Timeout | None:
    """A `?wait=S` request is answered after up to S seconds: read for that long and more."""
    wait = (call.params or {}).get("wait")
    return httpx.Timeout(wait + 30.0, connect=5.0) if wait else None


def _sse_timeout() -> httpx.Timeout:
    return httpx.Timeout(10.0, read=SSE_READ_TIMEOUT_S)
