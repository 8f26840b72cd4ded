"""Monthly token budgets (seed 000): None = unlimited; the period resets when it ends."""
from __future__ import annotations

from datetime import datetime, timedelta

from agentq.models import User


def roll_period(user: User, now: datetime, period_days: int) -> bool:
    """Start a new budget period if the current one has ended; True when it did."""
    if user.budget_reset_at is not None and now < user.budget_reset_at:
        return False
    user.tokens_used_this_month = 0
    user.budget_reset_at = now + timedelta(days=period_days)
    return True


def over_budget(user: User) -> bool:
    if user.token_budget_monthly is None:
        return False
    return user.tokens_used_this_month >= user.token_budget_monthly
