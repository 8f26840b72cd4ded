"""Waiting for a provider: the backoff and the wait-or-fail decision are pure functions."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from agentq.loop.decision import Stop, WaitForProvider, provider_backoff_s, wait_for_provider

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=timezone.utc)


def plan(now=T0, since=None, attempts=0, window_s=1800.0, jitter=0.0, retry_after_s=None,
         base_s=5.0, max_s=300.0):
    return wait_for_provider(now=now, waiting_since=since, attempts=attempts,
                             window_s=window_s, base_s=base_s, max_s=max_s, jitter=jitter,
                             retry_after_s=retry_after_s, last_error="HTTP 429")


def test_delays_grow_and_are_capped():
    delays = [provider_backoff_s(n, 5.0, 300.0, jitter=1.0) for n in range(1, 10)]
    assert delays[:7] == [5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 300.0]
    assert delays[7:] == [300.0, 300.0]


@pytest.mark.parametrize("jitter", [0.0, 0.3, 0.999])
def test_jitter_keeps_at_least_half_the_delay(jitter):
    delay = provider_backoff_s(3, 5.0, 300.0, jitter)
    assert 10.0 <= delay <= 20.0


def test_retry_after_is_a_floor_even_above_the_cap():
    assert provider_backoff_s(1, 5.0, 300.0, 0.0, retry_after_s=42.0) == 42.0
    assert provider_backoff_s(1, 5.0, 300.0, 0.0, retry_after_s=600.0) == 600.0
    assert provider_backoff_s(4, 5.0, 300.0, 1.0, retry_after_s=1.0) == 40.0


def test_a_huge_attempt_number_does_not_overflow():
    assert provider_backoff_s(10_000, 5.0, 300.0, 1.0) == 300.0


def test_the_first_transient_failure_starts_the_wait():
    decided = plan(jitter=1.0)
    assert decided == WaitForProvider(T0 + timedelta(seconds=5), 5.0, 1, T0)


def test_later_failures_keep_the_start_and_count_attempts():
    now = T0 + timedelta(seconds=100)
    decided = plan(now=now, since=T0, attempts=3, jitter=1.0)
    assert isinstance(decided, WaitForProvider)
    assert (decided.attempt, decided.waiting_since) == (4, T0)
    assert decided.next_attempt_at == now + timedelta(seconds=40)


def test_retry_after_sets_the_next_attempt():
    decided = plan(retry_after_s=30.0)
    assert decided.next_attempt_at == T0 + timedelta(seconds=30)


def test_the_last_attempt_is_made_at_the_end_of_the_window():
    now = T0 + timedelta(seconds=1790)
    decided = plan(now=now, since=T0, attempts=9, jitter=1.0)
    assert isinstance(decided, WaitForProvider)
    assert decided.next_attempt_at == T0 + timedelta(seconds=1800)
    assert decided.delay_s == 10.0


def test_a_failure_after_the_window_ends_the_job():
    now = T0 + timedelta(seconds=1800)
    decided = plan(now=now, since=T0, attempts=10)
    assert isinstance(decided, Stop)
    assert decided.reason == "error"
    assert decided.details["code"] == "provider_unavailable"
    assert decided.details["attempts_made"] == 11
    assert "HTTP 429" in decided.message


def test_a_zero_window_fails_at_the_first_failure():
    assert isinstance(plan(window_s=0), Stop)
