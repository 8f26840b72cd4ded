"""Monthly token budgets: the period rolls over when it ends; None is unlimited."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from agentq.loop.budget import over_budget, roll_period
from agentq.models import User

NOW = datetime(2030, 6, 15, 12, 0, tzinfo=timezone.utc)


def _user(**fields) -> User:
    values = dict(permission_level="guest", token_budget_monthly=1000,
                  tokens_used_this_month=700, budget_reset_at=NOW + timedelta(days=3))
    values.update(fields)
    return User(**values)


def test_an_ended_period_resets_the_count_and_moves_the_reset_date():
    # given a user whose period ended yesterday
    user = _user(budget_reset_at=NOW - timedelta(days=1))
    # when
    rolled = roll_period(user, NOW, period_days=30)
    # then
    assert rolled is True
    assert user.tokens_used_this_month == 0
    assert user.budget_reset_at == NOW + timedelta(days=30)


def test_a_period_ending_exactly_now_has_ended():
    # given
    user = _user(budget_reset_at=NOW)
    # when / then
    assert roll_period(user, NOW, period_days=7) is True
    assert user.budget_reset_at == NOW + timedelta(days=7)


def test_a_running_period_is_left_alone():
    # given a user whose period ends in three days
    reset = NOW + timedelta(days=3)
    user = _user(budget_reset_at=reset)
    # when
    rolled = roll_period(user, NOW, period_days=30)
    # then
    assert rolled is False
    assert user.tokens_used_this_month == 700
    assert user.budget_reset_at == reset


def test_no_budget_is_never_over_budget():
    # given / when / then
    assert over_budget(_user(token_budget_monthly=None, tokens_used_this_month=10**12)) is False


def test_over_budget_from_the_limit_on():
    # given / when / then
    assert over_budget(_user(token_budget_monthly=1000, tokens_used_this_month=999)) is False
    assert over_budget(_user(token_budget_monthly=1000, tokens_used_this_month=1000)) is True
