"""A submit rides out a database blip inside its request (issue 35).

A Postgres restart or failover takes a few seconds. A submit that meets it waits for the
database (retrying the whole request: authentication, the write, the answer), through
`agentq.db.riding_out` backing off from 0.1 s to 1 s, for AGENTQ_DATABASE_RIDE_OUT_S (8 s);
only past that does it answer 503 with Retry-After (api/errors.py). A client never sees a
blip that short.

A request is tried again only when that cannot create its job twice: when no transaction
of this attempt reached its COMMIT (the database was away before: nothing was written), or
when the request carries an Idempotency-Key (its key and its job commit together: the next
attempt finds the job and answers it). A COMMIT cut off without a key is ambiguous (the job
may exist) and is answered 503 at once, as before.
"""
from __future__ import annotations

import functools
from typing import Callable

from flask import g, has_app_context, request
from sqlalchemy import event
from sqlalchemy.orm import Session

from agentq.db import riding_out
from api.ratelimit import _release_request_holds as release_request_holds

FIRST_WAIT_S = 0.1
LONGEST_WAIT_S = 1.0


@event.listens_for(Session, "before_commit")
def _commit_reached(_session) -> None:
    if has_app_context():
        g.commit_reached = True


def rides_out_database(view: Callable) -> Callable:
    """Retry `view` (outside its authentication) while the database is away, within the
    settings' ride-out, when retrying cannot duplicate what it writes."""
    @functools.wraps(view)
    def inner(*args, **kwargs):
        for attempt in riding_out(g.settings.database_ride_out_s, "submit",
                                  first_wait_s=FIRST_WAIT_S, longest_wait_s=LONGEST_WAIT_S,
                                  path=request.path):
            release_request_holds()  # what an earlier attempt took, taken again by this one
            g.commit_reached = False
            with attempt:
                response = view(*args, **kwargs)
            outcome = attempt.retry_state.outcome
            if (outcome.failed and g.commit_reached
                    and request.headers.get("Idempotency-Key") is None):
                raise outcome.exception()  # the job may have been written: the client decides
        return response
    return inner
