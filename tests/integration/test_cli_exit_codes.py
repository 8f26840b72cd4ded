"""`agentq run` — the README's first command, as written there — against the scripted model:
its exit status says how the job ended (0 answered, 3 max_iterations or a cut reply,
4 budget, 5 failed, 6 cancelled, 7 still running after --timeout), and only an answer goes
to stdout.

Each run is a fresh process in the embedded mode (SQLite in its own AGENTQ_HOME, the
in-process broker and worker), pointed at the scripted server by OPENAI_BASE_URL; the
script's marker rides in the system prompt, so the user's message is the README's own."""
from __future__ import annotations

import signal
import threading

import pytest

from agentq.testing.scripted_llm import call, error, text, tool_calls
from tests.support.cli_run import RUN_TIMEOUT_S, agentq_run, finish, readme_run_command

pytestmark = pytest.mark.integration


def test_the_readme_command_is_agentq_run_with_the_question():
    assert readme_run_command() == ["run", "What is 6*7? Use the calculator."]


def test_answered_exits_0_with_only_the_answer_on_stdout(llm, script, tmp_path):
    marker = script([tool_calls(call("math.evaluate", {"expression": "6*7"})),
                     text("It is 42.")])
    code, out, err = finish(agentq_run(tmp_path, marker, llm))
    assert code == 0, err
    assert out == "It is 42.\n"
    assert "← math.evaluate ok" in err and "· completed (end_turn)" in err
    # human lines only on the terminal; the JSON logs (Celery's, Alembic's) in the log file
    assert not any(line.lstrip().startswith("{") for line in err.splitlines()), err
    for foreign in ("alembic", "kombu", "received", "succeeded", "\x1b["):
        assert foreign not in err, err
    logged = (tmp_path / "agentq.log").read_text()
    assert "alembic" in logged and "orchestrator.step" in logged


def test_verbose_also_shows_the_json_logs_on_stderr(llm, script, tmp_path):
    import json
    marker = script([tool_calls(call("math.evaluate", {"expression": "6*7"})),
                     text("It is 42.")])
    code, out, err = finish(agentq_run(tmp_path, marker, llm, options=("-v",)))
    assert code == 0, err
    assert out == "It is 42.\n"
    # the human lines are still there, and the JSON log records with them
    assert "← math.evaluate ok" in err and "· completed (end_turn)" in err
    records = [json.loads(line) for line in err.splitlines() if line.lstrip().startswith("{")]
    assert records and all(isinstance(r, dict) for r in records)
    assert any("orchestrator.step" in json.dumps(r) for r in records), err
    # and the log file has them as without -v
    assert "orchestrator.step" in (tmp_path / "agentq.log").read_text()


def test_the_iteration_limit_exits_3(llm, script, tmp_path):
    marker = script([tool_calls(call("math.evaluate", {"expression": "6*7"}))])
    code, out, err = finish(agentq_run(tmp_path, marker, llm, AGENTQ_MAX_ITERATIONS="1"))
    assert code == 3, err
    assert out == ""
    assert "completed (max_iterations)" in err.splitlines()[-1]


def test_a_reply_cut_at_the_output_limit_exits_3_with_what_there_is(llm, script, tmp_path):
    """Issue 31 item 2: a cut reply is no whole answer (finish_reason `length`)."""
    marker = script([text("It is 4", finish_reason="length")])
    code, out, err = finish(agentq_run(tmp_path, marker, llm))
    assert code == 3, err
    assert out == "It is 4\n"
    assert "completed (length)" in err.splitlines()[-1]


def test_a_used_up_budget_exits_4(llm, script, tmp_path):
    # the first model call costs 15 tokens of a 10-token budget; the second is refused
    marker = script([tool_calls(call("math.evaluate", {"expression": "6*7"}),
                                input_tokens=10, output_tokens=5)])
    code, out, err = finish(agentq_run(tmp_path, marker, llm,
                                       AGENTQ_GUEST_MONTHLY_TOKENS="10"))
    assert code == 4, err
    assert out == ""
    assert "failed (budget_exceeded)" in err.splitlines()[-1]


def test_a_failed_job_exits_5(llm, script, tmp_path):
    marker = script([error(400, "the model refuses this request")])
    code, out, err = finish(agentq_run(tmp_path, marker, llm))
    assert code == 5, err
    assert out == ""
    assert "failed (error)" in err.splitlines()[-1]


def ctrl_c_run(tmp_path, marker: str, llm, answer: threading.Event,
               press_after: tuple[str, ...], release_after: str | None = None
               ) -> tuple[int, str, str]:
    """`agentq run`, Ctrl-C pressed once after each of `press_after`'s lines in turn, the
    model's reply (held by `answer`) let go after the `release_after` line, then the run let
    end. (status, stdout, stderr)"""
    process = agentq_run(tmp_path, marker, llm)
    lines, presses = [], list(press_after)
    try:
        for line in process.stderr:
            lines.append(line)
            if presses and presses[0] in line:
                presses.pop(0)
                process.send_signal(signal.SIGINT)
            if release_after is not None and release_after in line:
                release_after = None
            if not presses and release_after is None:
                break
        answer.set()
        out, rest = process.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        answer.set()
        if process.poll() is None:
            process.kill()
    return process.returncode, out, "".join(lines) + rest


def test_ctrl_c_cancels_the_job_and_exits_6(llm, script, tmp_path):
    answer = threading.Event()  # the model answers only after the cancel is recorded
    marker = script([text("too late", hold=answer)])
    # Ctrl-C once the model call is under way; the reply is let go once the cancel is asked
    code, out, err = ctrl_c_run(tmp_path, marker, llm, answer, ("· turn 1",),
                                release_after="cancel requested")
    assert code == 6, err
    assert out == ""
    assert "cancelled (cancelled)" in err.splitlines()[-1]


def test_a_second_ctrl_c_stops_waiting_and_exits_130(llm, tmp_path):
    # (not the `script` fixture: whether the model is asked again after the cancel is the
    # worker's business, not this test's)
    answer = threading.Event()
    marker = llm.script(f"ctrl_c_twice_{tmp_path.name}", [text("too late", hold=answer)])
    # the second Ctrl-C while the model call is still held
    code, out, err = ctrl_c_run(tmp_path, marker, llm, answer,
                                ("· turn 1", "cancel requested"))
    assert code == 130, err
    assert out == ""
    assert "stopped waiting" in err.splitlines()[-1]


def test_still_running_after_the_timeout_exits_7(llm, tmp_path):
    # (not the `script` fixture: the run may end before its model call is even sent)
    answer = threading.Event()
    marker = llm.script(f"timeout_{tmp_path.name}", [text("late", hold=answer)])
    try:
        code, out, err = finish(agentq_run(tmp_path, marker, llm, "--timeout", "1"))
    finally:
        answer.set()
    assert code == 7, err
    assert out == ""
    # "still running" only of a job that runs: on a loaded machine its first step may not
    # have started within the second
    last = err.splitlines()[-1]
    assert "still running after 1 s" in last or "did not start within 1 s" in last, last
