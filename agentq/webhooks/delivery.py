"""Webhook deliveries: one row per attempt, the HTTP attempt itself, and the retry schedule.

An event (a job or batch that ended, with a callback URL) gets a `webhook-id` (`event_id`)
once; each attempt is a `WebhookDelivery` row carrying it: `pending` → `succeeded`, `failed`
(a next attempt row exists) or `gave_up` (410 Gone, the schedule used up, or the subject
gone). The first row is written in the transaction that ends the job, so an ended job never
loses its webhook; Celery only carries the row id.

The rows are written by `agentq.webhooks.outbox` in the caller's transaction (the job's end,
an approval request, a batch's end); this module sends them.

There is no payload column: the body is rebuilt from the job (or batch) row at send time.
An ended job's object no longer changes and the payload's `timestamp` is the job's
`finished_at`, so every attempt of one event sends the same bytes under the same webhook-id;
only the `webhook-timestamp` header (and so the signature) is the send time's.

Claiming: an attempt takes a row by moving its `next_attempt_at` forward by a lease (an
UPDATE that only one worker wins), so a duplicated broker message or a sweeper re-enqueue
never sends twice at once, and a worker that dies mid-send leaves a row the sweeper picks up
once the lease ends. The database connection is not held during the HTTP request.
"""
from __future__ import annotations

import email.utils
import functools
import json
import logging
import ssl
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Callable, Mapping
from urllib.parse import urlsplit

import httpx
from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from agentq import metrics
from agentq.config import Settings, get_settings
from agentq.db import riding_out, session_factory, utcnow
from agentq.errors import ConfigError, Conflict, ValidationFailed
from agentq.loop.states import ENDED
from agentq.models import Batch, Job, Tenant, WebhookDelivery
from agentq.views import _iso, batch_counts, batch_object, job_object
from agentq.webhooks.outbox import (
    APPROVAL_EVENT_TYPE,
    FAILED,
    GAVE_UP,
    PENDING,
    SUCCEEDED,
    TOOL_CALL_KEYS,
    enqueue_event,
)
from agentq.webhooks.secrets import signing_secrets
from agentq.webhooks.signing import signed_headers
from agentq.webhooks.urls import FIELD, Target, resolve_and_check

log = logging.getLogger(__name__)

GONE_STATUS = 410
RETRY_AFTER_MAX_S = 24 * 3600
"""A receiver's Retry-After is honoured when longer than the schedule's delay, up to this."""
CLAIM_EARLY_TOLERANCE_S = 1.0
"""A task may start this much before its row's next_attempt_at (clock skew between hosts)."""
LEASE_TIMEOUTS = 4
"""A claimed attempt is given this many timeouts (connect, write, read…) plus a margin."""
LEASE_MARGIN_S = 30.0
CLAIM_RIDE_OUT_S = 10.0
"""How long a claim is tried again while the database is away; past that the row waits for
the sweeper (`maintenance.sweep_webhooks`)."""
ERROR_MAX_CHARS = 500
USER_AGENT = "agentq-webhooks/1"
CONTENT_TYPE = "application/json"


# --- rows ---------------------------------------------------------------------------------

def deliveries_for_job(session: Session, job_id) -> list[WebhookDelivery]:
    """Every attempt for the job's events, oldest first."""
    return list(session.execute(
        select(WebhookDelivery).where(WebhookDelivery.job_id == job_id)
        .order_by(WebhookDelivery.created_at, WebhookDelivery.attempt)).scalars())


def redeliver_job_event(session: Session, job: Job) -> WebhookDelivery:
    """Send the job's event again: a new attempt of the same event (same `webhook-id`, same
    body), numbered after the last one. It continues the retry schedule from there: once the
    schedule is used up, a failed redelivery is not retried. The caller holds the job row
    locked, so two redeliveries cannot race."""
    if job.status not in ENDED:
        raise Conflict("The job has not ended; it has no event to deliver yet.",
                       status=job.status)
    if not job.callback_url:
        raise Conflict("The job has no callback_url.")
    rows = deliveries_for_job(session, job.id)
    pending = [row for row in rows if row.status == PENDING]
    if pending:
        raise Conflict("A delivery of this job's event is already pending.",
                       delivery_id=str(pending[0].id))
    event_type = f"job.{job.status}"
    previous = [row for row in rows if row.event_type == event_type]
    delivery = enqueue_event(
        session, tenant_id=job.tenant_id, event_type=event_type, url=job.callback_url,
        job_id=job.id,
        event_id=previous[-1].event_id if previous else None,
        attempt=max(row.attempt for row in previous) + 1 if previous else 1)
    log.info("webhook redelivery requested", extra={"delivery_id": str(delivery.id),
                                                     "event_id": delivery.event_id,
                                                     "attempt": delivery.attempt,
                                                     "job_id": str(job.id)})
    return delivery


# --- the body -----------------------------------------------------------------------------

def event_body(session: Session, delivery: WebhookDelivery) -> str | None:
    """The exact JSON text of the event, or None when its job or batch no longer exists."""
    if delivery.job_id is not None:
        job = session.get(Job, delivery.job_id)
        if job is None:
            return None
        data, at = job_object(job), job.finished_at
        if delivery.event_type == APPROVAL_EVENT_TYPE:
            call = delivery.data or {}
            data = {**data, "tool_call": {k: call.get(k) for k in TOOL_CALL_KEYS}}
            at = delivery.created_at
    else:
        batch = session.get(Batch, delivery.batch_id)
        if batch is None:
            return None
        # the batch object exactly as GET /v1/batches/<id> gives it
        data = batch_object(batch, batch_counts(session, batch.id))
        at = batch.finished_at
    payload = {"type": delivery.event_type, "timestamp": _iso(at or delivery.created_at),
               "data": data}
    return json.dumps(payload, separators=(",", ":"))


# --- one attempt --------------------------------------------------------------------------

@dataclass(frozen=True)
class Answer:
    """What the receiver said: its status code and Retry-After header, if any."""
    status_code: int
    retry_after: str | None = None


Sender = Callable[[Target, bytes, Mapping[str, str], float], Answer]


@functools.lru_cache(maxsize=1)
def _ssl_context() -> ssl.SSLContext:
    return httpx.create_ssl_context()


def http_send(target: Target, body: bytes, headers: Mapping[str, str],
              timeout_s: float) -> Answer:
    """POST once. No redirects, no proxies from the environment (the checked address is the
    one connected to), no pooled connection shared between hostnames (TLS names differ).
    The response body is never read. `timeout_s` bounds each network phase."""
    headers = dict(headers)
    extensions = {}
    if target.host_header:
        headers["Host"] = target.host_header
    if target.sni_hostname:
        extensions["sni_hostname"] = target.sni_hostname
    with httpx.Client(timeout=timeout_s, follow_redirects=False, trust_env=False,
                      verify=_ssl_context()) as client:
        request = client.build_request("POST", target.url, content=body, headers=headers,
                                       extensions=extensions)
        response = client.send(request, stream=True)
        try:
            return Answer(response.status_code, response.headers.get("retry-after"))
        finally:
            response.close()


@dataclass(frozen=True)
class _Claimed:
    delivery_id: uuid.UUID
    event_id: str
    event_type: str
    url: str
    attempt: int
    job_id: uuid.UUID | None
    batch_id: uuid.UUID | None
    body: str | None
    lease_until: datetime
    secrets: tuple[str, ...] = field(default=(), repr=False)
    """The event's tenant's signing secrets (agentq.webhooks.secrets), never shown."""


@dataclass(frozen=True)
class _Result:
    status_code: int | None = None
    latency_ms: int | None = None
    error: str | None = None
    succeeded: bool = False
    final: bool = False
    """No retry whatever the schedule says (410, the subject gone)."""
    retry_after_s: float | None = None


@dataclass(frozen=True)
class Outcome:
    """What an attempt did: `status` of its row (or `skipped`/`lost`), and the next
    attempt's row id with its delay when one was scheduled."""
    status: str
    retry_id: str | None = None
    retry_in_s: float | None = None


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Retry-After in seconds (delta-seconds or an HTTP date), or None if absent/invalid."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - now).total_seconds())


def retry_delay_s(schedule: tuple[float, ...], attempt: int,
                  retry_after_s: float | None = None) -> float | None:
    """Seconds before attempt `attempt + 1`, or None when attempt `attempt` was the last:
    `schedule[attempt - 1]`, or the receiver's Retry-After when longer (capped)."""
    if attempt < 1 or attempt > len(schedule):
        return None
    delay = float(schedule[attempt - 1])
    if retry_after_s is not None:
        delay = max(delay, min(retry_after_s, RETRY_AFTER_MAX_S))
    return delay


def _claim(sessions: sessionmaker, delivery_id: uuid.UUID,
           settings: Settings) -> _Claimed | None:
    now = utcnow()
    lease_until = now + timedelta(
        seconds=settings.webhook_timeout_s * LEASE_TIMEOUTS + LEASE_MARGIN_S)
    due_by = now + timedelta(seconds=CLAIM_EARLY_TOLERANCE_S)
    with sessions() as session, session.begin():
        taken = session.execute(
            update(WebhookDelivery)
            .where(WebhookDelivery.id == delivery_id, WebhookDelivery.status == PENDING,
                   or_(WebhookDelivery.next_attempt_at.is_(None),
                       WebhookDelivery.next_attempt_at <= due_by))
            .values(next_attempt_at=lease_until)
            .execution_options(synchronize_session=False)).rowcount
        if taken != 1:
            return None
        # the event's tenant comes with the delivery: its secrets sign this attempt
        delivery, tenant = session.execute(
            select(WebhookDelivery, Tenant)
            .join(Tenant, Tenant.id == WebhookDelivery.tenant_id)
            .where(WebhookDelivery.id == delivery_id)
            .execution_options(populate_existing=True)).one()
        return _Claimed(delivery.id, delivery.event_id, delivery.event_type, delivery.url,
                        delivery.attempt, delivery.job_id, delivery.batch_id,
                        event_body(session, delivery), lease_until,
                        signing_secrets(session, tenant, settings, now))


def _clip(text: str) -> str:
    return text if len(text) <= ERROR_MAX_CHARS else text[:ERROR_MAX_CHARS - 1] + "…"


def _send(claimed: _Claimed, settings: Settings, send: Sender) -> _Result:
    if claimed.body is None:
        return _Result(error="The job or batch of this event no longer exists.", final=True)
    try:
        # the event's own tenant's secrets: no tenant can sign what another's receiver takes
        headers = signed_headers(claimed.secrets, claimed.event_id, claimed.body)
        target = resolve_and_check(claimed.url, settings.webhook_allow_private)
    except ConfigError as exc:
        log.error("webhook not signed: secret misconfigured",
                  extra={"delivery_id": str(claimed.delivery_id), "problem": exc.message})
        return _Result(error=_clip(exc.message))
    except ValidationFailed as exc:
        return _Result(error=_clip(" ".join(exc.fields.get(FIELD) or [exc.message])))
    headers.update({"Content-Type": CONTENT_TYPE, "User-Agent": USER_AGENT})
    started = time.monotonic()
    try:
        answer = send(target, claimed.body.encode("utf-8"), headers,
                      settings.webhook_timeout_s)
    except httpx.TimeoutException:
        return _Result(latency_ms=_elapsed_ms(started),
                       error=f"No answer within {settings.webhook_timeout_s:g} s.")
    except httpx.HTTPError as exc:
        return _Result(latency_ms=_elapsed_ms(started),
                       error=_clip(f"{type(exc).__name__}: {exc}"))
    latency_ms = _elapsed_ms(started)
    code = answer.status_code
    if 200 <= code < 300:
        return _Result(code, latency_ms, succeeded=True)
    if code == GONE_STATUS:
        return _Result(code, latency_ms, "410 Gone: the receiver wants no more deliveries.",
                       final=True)
    error = (f"Redirect ({code}) not followed." if 300 <= code < 400
             else f"The receiver answered {code}.")
    return _Result(code, latency_ms, error,
                   retry_after_s=parse_retry_after(answer.retry_after, utcnow()))


def _elapsed_ms(started: float) -> int:
    return round((time.monotonic() - started) * 1000)


def _record(sessions: sessionmaker, claimed: _Claimed, result: _Result,
            settings: Settings) -> Outcome:
    with sessions() as session, session.begin():
        delivery = session.execute(
            select(WebhookDelivery)
            .where(WebhookDelivery.id == claimed.delivery_id,
                   WebhookDelivery.status == PENDING,
                   WebhookDelivery.next_attempt_at == claimed.lease_until)
            .with_for_update()).scalar_one_or_none()
        if delivery is None:
            log.warning("webhook lease lost; attempt not recorded",
                        extra={"delivery_id": str(claimed.delivery_id)})
            return Outcome("lost")
        delivery.status_code, delivery.latency_ms = result.status_code, result.latency_ms
        delivery.error, delivery.next_attempt_at = result.error, None
        retry: WebhookDelivery | None = None
        delay = None
        if result.succeeded:
            delivery.status = SUCCEEDED
        elif result.final:
            delivery.status = GAVE_UP
        else:
            delay = retry_delay_s(settings.webhook_retry_schedule_s, claimed.attempt,
                                  result.retry_after_s)
            if delay is None:
                delivery.status = GAVE_UP
            else:
                delivery.status = FAILED
                retry = enqueue_event(
                    session, tenant_id=delivery.tenant_id, event_type=claimed.event_type,
                    url=claimed.url,
                    job_id=claimed.job_id, batch_id=claimed.batch_id,
                    event_id=claimed.event_id, attempt=claimed.attempt + 1,
                    due=utcnow() + timedelta(seconds=delay))
        status = delivery.status
    metrics.webhook_attempt({SUCCEEDED: "delivered", FAILED: "retry"}.get(status, "failed"))
    log.log(logging.INFO if result.succeeded else logging.WARNING, "webhook attempt",
            extra={"delivery_id": str(claimed.delivery_id), "event_id": claimed.event_id,
                   "event_type": claimed.event_type, "attempt": claimed.attempt,
                   "host": urlsplit(claimed.url).hostname, "status": status,
                   "status_code": result.status_code, "latency_ms": result.latency_ms,
                   "error": result.error, "retry_in_s": delay})
    return Outcome(status, str(retry.id) if retry else None, delay if retry else None)


def attempt_delivery(delivery_id, *, settings: Settings | None = None,
                     sessions: sessionmaker | None = None,
                     send: Sender = http_send) -> Outcome:
    """Make one attempt of a pending delivery, if it is due and no one else holds it;
    record what happened and, on a retryable failure, the next attempt's row."""
    settings = settings or get_settings()
    sessions = sessions or session_factory(settings)
    # the claim sends nothing: tried again at once through a blip or a statement a
    # migration made stale (agentq.prepared's StalePlan), rather than left to the sweeper
    for attempt in riding_out(CLAIM_RIDE_OUT_S, "delivery claim",
                              delivery_id=str(delivery_id)):
        with attempt:
            claimed = _claim(sessions, uuid.UUID(str(delivery_id)), settings)
    if claimed is None:
        log.info("webhook delivery not due or already taken",
                 extra={"delivery_id": str(delivery_id)})
        return Outcome("skipped")
    result = _send(claimed, settings, send)
    # the receiver answered: that answer is recorded through a database outage, while the
    # lease lasts, rather than lost and the event sent again
    for attempt in riding_out((claimed.lease_until - utcnow()).total_seconds(),
                              "delivery attempt", delivery_id=str(claimed.delivery_id)):
        with attempt:
            outcome = _record(sessions, claimed, result, settings)
    return outcome
