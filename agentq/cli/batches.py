"""`agentq batch …` and `agentq replay …`: batches and replays of a running API, for people.

Registered on the `agentq` command group by agentq.cli; talks HTTP through its client.
"""
from __future__ import annotations

import json
import math
import re
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import click

from agentq.cli.core import main
from agentq.cli.remote import _api_client, _api_errors, _api_options
from agentq.loop.states import BATCH_ENDED, ENDED_STATUSES, REPLAY_MODES, JobStatus, ReplayMode

if TYPE_CHECKING:
    from agentq.client import AgentQ

POLL_S = 1.0
BAR_WIDTH = 30
DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd])$")
UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_since(value: str, now: datetime | None = None) -> datetime:
    """`2h`, `30m`, `1d` ago, or an ISO 8601 time (UTC when it names no zone)."""
    now = now or datetime.now(timezone.utc)
    match = DURATION.match(value.strip())
    if match:
        return now - timedelta(seconds=float(match.group(1)) * UNITS_S[match.group(2)])
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r}: give a duration like 2h, 30m, 1d or an ISO "
                                 "8601 time") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def progress_line(counts: dict, started: float, now: float) -> str:
    """done / failed / total, rate and time left, as one line with a bar."""
    total = counts.get("total") or 0
    done = sum(counts.get(k, 0) for k in ENDED_STATUSES)
    elapsed = max(now - started, 1e-6)
    rate = done / elapsed
    left = (total - done) / rate if rate > 0 else None
    filled = int(BAR_WIDTH * done / total) if total else BAR_WIDTH
    eta = f"{left:,.0f} s left" if left is not None else "-- s left"
    return (f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {done}/{total} done, "
            f"{counts.get('failed', 0)} failed, {rate:.1f}/s, {eta}")


def _watch(client: AgentQ, batch_id: str, timeout_s: float) -> dict:
    started = time.monotonic()
    tty = sys.stderr.isatty()
    while True:
        batch = client.batch(batch_id).raw
        line = progress_line(batch["counts"], started, time.monotonic())
        click.echo(("\r" + line) if tty else line, err=True, nl=not tty)
        if batch["status"] in BATCH_ENDED:
            if tty:
                click.echo("", err=True)
            return batch
        if time.monotonic() - started > timeout_s:
            raise click.ClickException(f"batch {batch_id} still {batch['status']} after "
                                       f"{timeout_s:g} s")
        time.sleep(POLL_S)


@main.group("batch")
def batch() -> None:
    """Batches of messages."""


@batch.command("submit")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--wait", is_flag=True, help="Show progress until the batch ends.")
@click.option("--max-concurrency", type=int, default=None,
              help="Jobs of the batch running at once (default: "
                   "AGENTQ_BATCH_MAX_CONCURRENCY).")
@click.option("--callback-url", default=None,
              help="A URL that gets one signed webhook when the batch ends.")
@click.option("--timeout", "timeout_s", type=float, default=24 * 3600, show_default=True,
              help="With --wait: stop following after this many seconds.")
@_api_options
def batch_submit(file: Path, wait: bool, max_concurrency: int | None,
                 callback_url: str | None, timeout_s: float, url: str | None,
                 key: str | None) -> None:
    """Submit FILE.jsonl: one POST /v1/messages body a line (optional custom_id)."""
    with _api_client(url, key) as client, _api_errors(client):
        created = client.submit_batch(file.read_bytes(), callback_url=callback_url,
                                      max_concurrency=max_concurrency)
        click.echo(created.id)
        if wait:
            ended = _watch(client, created.id, timeout_s)
            click.echo(json.dumps(ended["counts"]), err=True)
            sys.exit(0 if ended["counts"].get("failed", 0) == 0 else 1)


@batch.command("results")
@click.argument("batch_id")
@_api_options
def batch_results(batch_id: str, url: str | None, key: str | None) -> None:
    """Print the batch's finished results as JSONL, in request order."""
    with _api_client(url, key) as client, _api_errors(client):
        for line in client.batch_result_lines(batch_id):
            click.echo(line)


@batch.command("cancel")
@click.argument("batch_id")
@_api_options
def batch_cancel(batch_id: str, url: str | None, key: str | None) -> None:
    """Cancel what has not finished."""
    with _api_client(url, key) as client, _api_errors(client):
        click.echo(json.dumps(client.cancel_batch(batch_id).raw))


@main.command("replay")
@click.argument("job_id", required=False)
@click.option("--mode", type=click.Choice(REPLAY_MODES), default=ReplayMode.RECORDED.value,
              show_default=True,
              help="recorded: the original's model replies, tools run again; live: the "
                   "model is asked again.")
@click.option("--model", default=None, help="Another model (live mode).")
@click.option("--failed", is_flag=True, help="Replay the failed jobs of a window.")
@click.option("--since", default=None, help="With --failed: 2h, 30m, 1d or an ISO time.")
@click.option("--until", default=None,
              help="With --failed: the end of the window (2h, 30m, 1d ago or an ISO time; "
                   "default now).")
@click.option("--timeout", "timeout_s", type=float, default=3600, show_default=True,
              help="How long to wait for the replays to end.")
@_api_options
def replay(job_id: str | None, mode: str, model: str | None, failed: bool,
           since: str | None, until: str | None, timeout_s: float, url: str | None,
           key: str | None) -> None:
    """Replay JOB_ID, or every failed job of a window (--failed --since 2h), and show how
    the answers changed."""
    if bool(job_id) == failed:
        raise click.UsageError("give a JOB_ID or --failed (with --since), not both")
    with _api_client(url, key) as client, _api_errors(client):
        if job_id:
            job = client.replay(job_id, mode, model)
            _print_comparison(client, client.wait(job.id, timeout_s=math.inf).id)
            return
        window = {"status": JobStatus.FAILED.value}
        if since:
            window["since"] = parse_since(since).isoformat()
        if until:
            window["until"] = parse_since(until).isoformat()
        created = client.replay_batch(filter=window, mode=mode, model=model)
        click.echo(f"replaying {created.raw['metadata'].get('matched')} failed job(s): batch "
                   f"{created.id}", err=True)
        _watch(client, created.id, timeout_s)
        ids = [json.loads(line)["id"] for line in client.batch_result_lines(created.id)]
        for ident in ids:
            _print_comparison(client, ident)


def _print_comparison(client: AgentQ, replay_id: str) -> None:
    compared = client.compare(replay_id)
    original, replayed = compared["original"], compared["replay"]
    verdict = "same answer" if compared["same_answer"] else "changed"
    click.echo(f"{original['job_id'] if original else '?'} → {replay_id}: {verdict}")
    click.echo(f"  before: {_answer_of(original)}")
    click.echo(f"  after:  {_answer_of(replayed)}")


def _answer_of(side: dict | None) -> str:
    if not side:
        return "-"
    text = (side.get("content") or "").strip().replace("\n", " ")
    return f"[{side.get('status')}] {text[:100]}"
