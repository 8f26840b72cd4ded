"""The batch and replay commands' pure parts: time windows and the progress line."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import click
import pytest

from agentq.cli.batches import parse_since, progress_line

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc)


@pytest.mark.parametrize("text, ago", [("2h", timedelta(hours=2)), ("30m", timedelta(minutes=30)),
                                       ("1d", timedelta(days=1)), ("45s", timedelta(seconds=45)),
                                       ("1.5h", timedelta(minutes=90))])
def test_since_accepts_durations(text, ago):
    assert parse_since(text, NOW) == NOW - ago


def test_since_accepts_iso_times_and_treats_naive_ones_as_utc():
    assert parse_since("2026-11-20T10:00:00", NOW) == datetime(2026, 11, 20, 10,
                                                               tzinfo=timezone.utc)
    assert parse_since("2026-11-20T10:00:00+02:00", NOW).utcoffset() == timedelta(hours=2)


@pytest.mark.parametrize("bad", ["yesterday", "2 weeks", "h2", ""])
def test_since_refuses_anything_else_with_a_clear_message(bad):
    with pytest.raises(click.BadParameter, match="duration like 2h"):
        parse_since(bad, NOW)


def test_progress_line_counts_done_failed_rate_and_time_left():
    counts = {"total": 100, "completed": 30, "failed": 5, "cancelled": 5, "queued": 60}
    line = progress_line(counts, started=0.0, now=10.0)
    assert "40/100 done" in line and "5 failed" in line
    assert "4.0/s" in line and "15 s left" in line
    assert line.startswith("[" + "#" * 12 + ".")


def test_progress_line_before_anything_finished():
    assert "-- s left" in progress_line({"total": 3}, started=0.0, now=1.0)
