"""A streamed reply's text, published as it arrives (`message_delta` events through this
process's hub to the job's SSE listeners), never stored piece by piece."""
from __future__ import annotations

import logging
from typing import Callable

from agentq.db import utcnow
from agentq.loop.turn import Wired
from agentq.notify import hub_for

log = logging.getLogger(__name__)


def delta_publisher(step: Wired, job_id: str, turn: int) -> Callable[[str, int], None]:
    """A streamed reply's `on_delta`: each piece of text goes to the job's live listeners
    (SSE), not to the database: the stored record is the whole message, written as without
    streaming. `attempt` changes when a cut stream was retried: listeners drop the earlier
    pieces. A listener's loss never fails the step."""
    hub = hub_for(step.settings)
    counter = iter(range(1 << 62))

    def on_delta(text_: str, attempt: int) -> None:
        try:
            hub.publish(job_id, [{"type": "message_delta", "seq": None,
                                  "data": {"turn": turn, "attempt": attempt,
                                           "index": next(counter), "delta": text_},
                                  "created_at": utcnow().isoformat()}])
        except Exception:  # a listener's loss never fails the step
            log.warning("delta not published", exc_info=True)
    return on_delta
