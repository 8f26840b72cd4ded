"""The test hooks' log (tests/support/hooks_dist, an installed distribution whose hooks
append each call to AGENTQ_TEST_HOOK_LOG), read by the hook tests."""
from __future__ import annotations

import json
import time
from pathlib import Path

from tests.support.stack import ROOT

DIST = ROOT / "tests" / "support" / "hooks_dist"
"""On the path of a stack whose hooks are tested (`own_stack(pythonpath=DIST)`)."""
LOOP_HOOKS = ("after_loop", "after_compaction")
"""Left out of `_calls` unless asked for (tests/integration/test_compaction_strategy.py)."""


def _calls(hook_log: Path, job_id: str, expect: int = 0,
           hooks: tuple[str, ...] | None = None) -> list[dict]:
    """The turn hooks' calls logged for a job (`hooks`: those hooks' instead); `expect`:
    wait until that many are (after_turn runs once the turn's end has committed, so it
    may come after the job reads as ended)."""
    while True:  # calls that never come are the test's timeout
        calls = [] if not hook_log.exists() else [
            c for c in map(json.loads, hook_log.read_text().splitlines())
            if c["job_id"] == job_id and (
                c["hook"] in hooks if hooks else c["hook"] not in LOOP_HOOKS)]
        if len(calls) >= expect:
            return calls
        time.sleep(0.05)
