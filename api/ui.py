"""The web dashboard under /ui: server-rendered pages (Jinja, no build step) over the same
rows and the same route logic as the API, behind an API key (admin or tenant).

Sign-in takes an API key once and keeps it in an HttpOnly, SameSite=Strict cookie scoped to
/ui; every page then sees exactly what that key sees through the API (its tenant, and its
own rows unless admin). Changes (cancel, replay, sign-out) are POSTs that must come from
this origin. Live updates use the job's event stream (the API's SSE, read with the cookie):
a job page appends events as they happen; the jobs list follows its live jobs.
"""
from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone
from typing import Any, Iterable, TypeVarTuple, Unpack
from urllib.parse import urlsplit

from flask import Blueprint, Response, abort, g, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from sqlalchemy import Select, and_, or_, select
from sqlalchemy.orm import Session

from agentq.db import session_factory, session_scope, snapshot_scope, utcnow
from agentq.errors import AgentqError
from agentq.keys import lookup
from agentq.loop import replay
from agentq.loop.states import (
    ENDED,
    FINISH_REASONS,
    JOB_STATUSES,
    LIVE_STATUSES,
    REPLAY_MODES,
    UNENDED_STATUSES,
    JobStatus,
    ReplayMode,
)
from agentq.loop.store import event_dict
from agentq.loop.uow import UnitOfWork
from agentq.models import (
    Batch,
    Job,
    JobEvent,
    Schedule,
    TokenLog,
    ToolCall,
    UserPlatformLink,
    WebhookDelivery,
)
from agentq.views import SHOWN_WAITS, batch_counts, batch_object, delivery_object, job_object
from api import ui_overview
from api import ui_timeline as timeline
from api.auth import can_see
from api.views import short_id

bp = Blueprint("ui", __name__, url_prefix="/ui", template_folder="templates",
               static_folder="static", static_url_path="/static")
Row = TypeVarTuple("Row")
"""The column types of a query's rows, kept by `_visible`."""
bp.add_app_template_filter(short_id, "short_id")
COOKIE = "agentq_ui_key"
PAGE = 50
STATUSES = JOB_STATUSES
"""As the API shows them: `waiting` is a live job waiting for a person, its children or
its provider."""
LIVE = UNENDED_STATUSES
OVERVIEW_REFRESH_S = 10
"""The overview page reads itself again this often (api/static/ui.js)."""
QUERY_PARAMETERS = {  # what each page takes (api/limits.py refuses any other)
    "/ui/sign-in": {"next"},
    "/ui/schedules": {"message"},
    "/ui/jobs": {"status", "finish_reason", "user", "since", "until", "rows"},
    "/ui/jobs/<job_id>": {"message", "part"},
    "/ui/jobs/<job_id>/events": {"after"},
    "/ui/overview": {"part"},
}


@bp.before_request
def _signed_in() -> ResponseReturnValue | None:
    if request.endpoint in ("ui.sign_in", "ui.static"):
        return None
    if request.method == "POST" and not _same_origin():
        abort(403)
    key = request.cookies.get(COOKIE, "")
    with session_scope(g.settings) as session:
        row = lookup(session, key) if key else None
        if row is None:
            return redirect(url_for("ui.sign_in", next=request.full_path))
        g.api_key_id, g.is_admin, g.tenant_id = row.id, row.is_admin, row.tenant_id
        g.is_operator = bool(row.is_operator)  # the pages act in the key's tenant all the same
    return None


def _same_origin() -> bool:
    origin = request.headers.get("Origin") or request.headers.get("Referer")
    return bool(origin) and urlsplit(origin).netloc == request.host


def _visible(query: Select[Unpack[Row]],
             model: type[Job] | type[Batch] | type[Schedule] = Job) -> Select[Unpack[Row]]:
    query = query.where(model.tenant_id == g.tenant_id)
    return query if g.is_admin else query.where(model.api_key_id == g.api_key_id)


@bp.route("/sign-in", methods=["GET", "POST"])
def sign_in() -> ResponseReturnValue:
    error = None
    target = request.values.get("next") or url_for("ui.jobs")
    if not target.startswith("/ui"):
        target = url_for("ui.jobs")
    if request.method == "POST":
        if not _same_origin():
            abort(403)
        key = (request.form.get("key") or "").strip()
        with session_scope(g.settings) as session:
            valid = bool(key) and lookup(session, key) is not None
        if valid:
            response = redirect(target)
            response.set_cookie(COOKIE, key, httponly=True, samesite="Strict", path="/ui",
                                secure=request.is_secure)
            return response
        error = "That API key is not valid."
    status = 401 if error else 200
    return render_template("ui/sign_in.html", error=error, next=target), status


@bp.post("/sign-out")
def sign_out() -> ResponseReturnValue:
    response = redirect(url_for("ui.sign_in"))
    response.delete_cookie(COOKIE, path="/ui")
    return response


@bp.get("/")
def home() -> ResponseReturnValue:
    return redirect(url_for("ui.jobs"))


# --- jobs ----------------------------------------------------------------------------------
def _when(raw: str | None, name: str, errors: list[str]) -> datetime | None:
    if not raw:
        return None
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        errors.append(f"{name}: not a date and time ({raw!r}).")
        return None
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


def _job_rows(filters: dict[str, str], errors: list[str]) -> list[dict[str, Any]]:
    query = _visible(select(Job, UserPlatformLink.platform_user_id)
                     .outerjoin(UserPlatformLink, UserPlatformLink.user_id == Job.user_id))
    waits = or_(Job.waiting_for.is_(None), Job.waiting_for.notin_(SHOWN_WAITS))
    if filters["status"] == JobStatus.WAITING:  # as job_status shows it
        query = query.where(or_(Job.status == JobStatus.WAITING, and_(
            Job.status.in_(LIVE), Job.waiting_for.in_(SHOWN_WAITS))))
    elif filters["status"] in LIVE_STATUSES:
        query = query.where(Job.status == filters["status"], waits)
    elif filters["status"] in STATUSES:
        query = query.where(Job.status == filters["status"])
    if filters["finish_reason"] in FINISH_REASONS:
        query = query.where(Job.finish_reason == filters["finish_reason"])
    if filters["user"]:
        query = query.where(UserPlatformLink.platform_user_id == filters["user"])
    since = _when(filters["since"], "From", errors)
    until = _when(filters["until"], "Until", errors)
    if since:
        query = query.where(Job.created_at >= since)
    if until:
        query = query.where(Job.created_at < until)
    with session_scope(g.settings) as session:
        rows = session.execute(query.order_by(Job.created_at.desc()).limit(PAGE)).all()
        models = _models_of(session, [job.id for job, _ in rows])
        now = utcnow()
        seen, out = set(), []
        for job, user in rows:
            if job.id in seen:  # a user with two platform links: one row
                continue
            seen.add(job.id)
            out.append({**job_object(job), "user": user, "question": _first_line(job.content),
                        "model": ", ".join(models.get(job.id, ())) or job.model or "",
                        "duration_s": ((job.finished_at or now) - job.created_at
                                       ).total_seconds()})
        longest = max((row["duration_s"] for row in out), default=0.0)
        for row in out:
            row["bar"] = round(100.0 * row["duration_s"] / longest, 2) if longest else 0.0
        return out


def _models_of(session: Session, job_ids: list[uuid.UUID]) -> dict[uuid.UUID, list[str]]:
    """The models that answered each job (its turns' token logs), in the order they did."""
    if not job_ids:
        return {}
    out: dict[uuid.UUID, list[str]] = {}
    for job_id, model in session.execute(
            select(TokenLog.job_id, TokenLog.model)
            .where(TokenLog.job_id.in_(job_ids), TokenLog.iteration > 0)
            .order_by(TokenLog.job_id, TokenLog.iteration)):
        if job_id is not None and model and model not in out.setdefault(job_id, []):
            out[job_id].append(model)
    return out


@bp.get("/jobs")
def jobs() -> ResponseReturnValue:
    filters = {k: (request.args.get(k) or "").strip()
               for k in ("status", "finish_reason", "user", "since", "until")}
    errors: list[str] = []
    rows = _job_rows(filters, errors)
    template = "ui/job_rows.html" if request.args.get("rows") else "ui/jobs.html"
    return render_template(template, jobs=rows, filters=filters, errors=errors,
                           statuses=STATUSES, finish_reasons=FINISH_REASONS,
                           duration=timeline.duration, live=LIVE)


def _load_job(session: Session, job_id: str) -> Job:
    try:
        job = session.get(Job, uuid.UUID(job_id))
    except ValueError:
        job = None
    if job is None or not can_see(job):
        abort(404)
    return job


@bp.get("/jobs/<job_id>")
def job(job_id: str) -> ResponseReturnValue:
    # one snapshot: the status, the timeline and the last event number the page's script
    # follows from must be of one moment (tests/unit/test_ui_snapshot.py)
    with snapshot_scope(g.settings) as session:
        row = _load_job(session, job_id)
        event_rows = session.execute(
            select(JobEvent).where(JobEvent.job_id == row.id).order_by(JobEvent.seq)
        ).scalars().all()
        events = [event_dict(e) for e in event_rows]
        call_rows = session.execute(select(ToolCall).where(ToolCall.job_id == row.id)
                                    .order_by(ToolCall.created_at, ToolCall.position)
                                    ).scalars().all()
        calls = {c.tool_use_id: {"name": c.name, "arguments": c.arguments,
                                 "result": c.result, "status": c.status,
                                 "tool_use_id": c.tool_use_id} for c in call_rows}
        usage = session.execute(select(TokenLog).where(TokenLog.job_id == row.id)
                                .order_by(TokenLog.iteration)).scalars().all()
        waterfall = timeline.build(row, event_rows, call_rows, usage, utcnow())
        if request.args.get("part") == "waterfall":  # the live page's redraw
            return render_template("ui/waterfall.html", waterfall=waterfall,
                                   duration=timeline.duration, pretty=_pretty)
        question = _first_line(row.content)
        models = ", ".join(_used_models(usage)) or row.model or ""
        deliveries = [delivery_object(d) for d in session.execute(
            select(WebhookDelivery).where(WebhookDelivery.job_id == row.id)
            .order_by(WebhookDelivery.created_at)).scalars()]
        replays = [str(r) for r in session.execute(
            _visible(select(Job.id)).where(Job.replay_of == row.id)
            .order_by(Job.created_at)).scalars()]
        body = job_object(row)
    from agentq.loop.approvals import AWAITING
    awaiting = [c for c in calls.values() if c["status"] == AWAITING]
    return render_template("ui/job.html", job=body, events=events, calls=calls,
                           awaiting=awaiting, live=LIVE, deliveries=deliveries,
                           replays=replays, waterfall=waterfall, kinds=timeline.KINDS,
                           duration=timeline.duration, question=question, models=models,
                           last_seq=events[-1]["seq"] if events else 0,
                           pretty=_pretty, message=request.args.get("message"))


@bp.get("/jobs/<job_id>/events")
def job_events(job_id: str) -> ResponseReturnValue:
    """The API's event stream of the job (SSE), for the pages."""
    from api.jobs import list_events
    return list_events.__wrapped__(job_id)


@bp.post("/jobs/<job_id>/cancel")
def cancel(job_id: str) -> ResponseReturnValue:
    from api.jobs import cancel_job
    try:
        cancel_job.__wrapped__(job_id)
        message = "Cancel requested: the job ends at its next step."
    except AgentqError as exc:
        if getattr(exc, "status", None) == 404:
            abort(404)
        message = exc.message
    return redirect(url_for("ui.job", job_id=job_id, message=message))


@bp.post("/jobs/<job_id>/tool_calls/<tool_use_id>/<decision>")
def decide(job_id: str, tool_use_id: str, decision: str) -> ResponseReturnValue:
    """Approve or deny a call waiting for approval, through the API's own route logic
    (POST /v1/jobs/<id>/tool_calls/<tool_use_id>/approve|deny)."""
    from agentq.loop.approvals import MAX_REASON_CHARS, approve, deny
    from agentq.tools.registry import get_registry
    from api.jobs import _decide
    if decision not in ("approve", "deny"):
        abort(404)
    reason = (request.form.get("reason") or "").strip()[:MAX_REASON_CHARS] or None
    try:
        if decision == "approve":
            registry = get_registry(g.settings)
            _decide(job_id, lambda uow, ident: approve(uow, ident, tool_use_id, None,
                                                       registry))
            message = "Approved: the call runs now."
        else:
            _decide(job_id, lambda uow, ident: deny(uow, ident, tool_use_id, reason))
            message = "Denied: the model reads that the call was refused."
    except AgentqError as exc:
        if getattr(exc, "status", None) == 404:
            abort(404)
        message = exc.message
    return redirect(url_for("ui.job", job_id=job_id, message=message))


@bp.post("/jobs/<job_id>/replay")
def replay_job(job_id: str) -> ResponseReturnValue:
    mode = request.form.get("mode", ReplayMode.RECORDED)
    if mode not in REPLAY_MODES:
        return redirect(url_for("ui.job", job_id=job_id, message=f"No replay mode {mode!r}."))
    with UnitOfWork(session_factory(g.settings)) as uow:
        original = _load_job(uow.session, job_id)
        if original.status not in ENDED:
            return redirect(url_for("ui.job", job_id=job_id,
                                    message="Replay a job once it has ended."))
        new = replay.create_replay(uow, g.settings, original, mode, api_key_id=g.api_key_id)
        new_id = str(new.id)
    return redirect(url_for("ui.job", job_id=new_id, message=f"Replay ({mode}) of {job_id}."))


@bp.get("/jobs/<job_id>/compare")
def compare(job_id: str) -> ResponseReturnValue:
    with session_scope(g.settings) as session:
        row = _load_job(session, job_id)
        if row.replay_of is None:
            abort(404)
        sides = replay.compare(session, row)
    return render_template("ui/compare.html", job_id=job_id, compare=sides, pretty=_pretty)


# --- overview ------------------------------------------------------------------------------
def _overview_scope() -> tuple[ui_overview.Visible, str]:
    """(what the overview counts, said in words): an operator every tenant's jobs, a tenant
    admin its tenant's, another key its own (as the API shows jobs)."""
    if g.is_operator:
        return (lambda query: query), "every tenant's jobs (an operator key)"
    return _visible, ("this tenant's jobs (an admin key)" if g.is_admin
                      else "the jobs of this key")


@bp.get("/overview")
def overview() -> ResponseReturnValue:
    visible, scope = _overview_scope()
    with snapshot_scope(g.settings) as session:
        view = ui_overview.read(session, utcnow(), visible, scope)
    view.queues = ui_overview.queue_depths(g.settings)
    view.workers = ui_overview.workers(g.settings)
    template = "ui/overview_live.html" if request.args.get("part") else "ui/overview.html"
    return render_template(template, o=view, duration=timeline.duration,
                           refresh_s=OVERVIEW_REFRESH_S)


# --- batches -------------------------------------------------------------------------------
@bp.get("/batches")
def batches() -> ResponseReturnValue:
    with session_scope(g.settings) as session:
        rows = session.execute(_visible(select(Batch), Batch).order_by(Batch.created_at.desc())
                               .limit(PAGE)).scalars().all()
        items = [batch_object(b, batch_counts(session, b.id)) for b in rows]
    return render_template("ui/batches.html", batches=items)


# --- schedules -----------------------------------------------------------------------------
@bp.get("/schedules")
def schedules() -> ResponseReturnValue:
    from agentq.schedules import last_jobs, schedule_object
    with session_scope(g.settings) as session:
        rows = session.execute(_visible(select(Schedule), Schedule)
                               .where(Schedule.cancelled_at.is_(None))
                               .order_by(Schedule.created_at.desc(), Schedule.id)
                               .limit(PAGE)).scalars().all()
        last = last_jobs(session, [s.id for s in rows])
        items = [schedule_object(s, last_job_id=last.get(s.id)) for s in rows]
    return render_template("ui/schedules.html", schedules=items,
                           message=request.args.get("message"))


@bp.post("/schedules/<schedule_id>/cancel")
def cancel_schedule(schedule_id: str) -> ResponseReturnValue:
    from agentq.schedules import cancel_schedule as cancel
    from api.schedules import load_schedule
    try:
        with session_scope(g.settings) as session:
            cancel(session, load_schedule(session, schedule_id))
        message = f"Schedule {short_id(schedule_id)} cancelled: it will not run again."
    except AgentqError as exc:
        if getattr(exc, "status", None) == 404:
            abort(404)
        message = exc.message
    return redirect(url_for("ui.schedules", message=message))


@bp.errorhandler(404)
def _absent(_exc: Exception) -> ResponseReturnValue:
    return render_template("ui/absent.html"), 404


@bp.errorhandler(403)
def _refused(_exc: Exception) -> ResponseReturnValue:
    return Response("This change must come from the dashboard's own pages.", 403,
                    mimetype="text/plain")


def _first_line(text: str | None, most: int = 120) -> str:
    """The first non-blank line of `text`, cut at `most` characters."""
    line = next((line.strip() for line in (text or "").splitlines() if line.strip()), "")
    return line if len(line) <= most else line[:most - 1] + "…"


def _pretty(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, indent=2, ensure_ascii=False,
                      default=lambda v: v.isoformat() if isinstance(v, datetime) else str(v))


def _used_models(token_logs: Iterable[TokenLog]) -> list[str]:
    """The models that answered, in the order they first did (each once)."""
    return list(dict.fromkeys(t.model for t in token_logs if t.model))


@bp.after_request
def _headers(response: Response) -> Response:
    response.headers.setdefault("Content-Security-Policy",
                                "default-src 'self'; style-src 'self'; script-src 'self'")
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("Cache-Control", "no-store")
    return response

