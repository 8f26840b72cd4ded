"""One step of a job, driven without Celery: a scripted model, a database of the test's
(SQLite, or Postgres with AGENTQ_UNIT_DB=postgres), and the effects each step returns
dispatched by hand."""
from __future__ import annotations

import contextlib
import json
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from agentq.db import utcnow
from agentq.errors import ProviderError
from agentq.llm.types import LLMReply, ToolCallRequest
from agentq.loop import uow
from agentq.loop.effects import DispatchTools, JobEnded, NextStep
from agentq.loop.execute import execute_tool_call
from agentq.models import FileRecord, Job, JobEvent, Message, TokenLog, ToolCall, User
from agentq.testing.harness import MODEL, calls, text
from tests.support.sql import sql_sent

# --- a plain answer -------------------------------------------------------------------

def test_a_plain_answer_completes_the_job(make):
    # given a job and a model that answers in text
    h = make(text("4", input_tokens=100, output_tokens=20))
    job_id = h.submit("What is 2+2?")
    # when
    effects = h.stepper.run(job_id, 0, "start")
    # then
    assert effects == [JobEnded(job_id, "completed")]
    job = h.job(job_id)
    assert (job.status, job.finish_reason, job.iteration) == ("completed", "end_turn", 1)
    assert job.response["content"] == "4"
    assert job.response["error"] is None and job.response["files"] == []
    assert job.finished_at is not None
    messages = h.rows(Message, job_id, Message.seq)
    assert [(m.role, m.content) for m in messages] == [("user", "What is 2+2?"),
                                                       ("assistant", "4")]
    (log,) = h.rows(TokenLog, job_id)
    assert (log.input_tokens, log.output_tokens, log.model) == (100, 20, MODEL)
    assert log.cost_estimate > 0
    assert job.cost_estimate == pytest.approx(log.cost_estimate)
    assert h.user_of(job_id).tokens_used_this_month == 120
    # and the model saw the system prompt, the question and the guest's tools
    (request,) = h.router.requests
    assert request["messages"][0]["role"] == "system"
    assert request["messages"][-1] == {"role": "user", "content": "What is 2+2?"}
    assert "math.evaluate" in request["tools"] and "code.run_python" not in request["tools"]
    assert request["model"] == MODEL


def test_the_output_tokens_are_capped_by_the_budget_left(make):
    # given a guest with 100 tokens of budget left
    h = make(text("ok"), AGENTQ_GUEST_MONTHLY_TOKENS="1000")
    job_id = h.submit()
    with h.sessions() as session, session.begin():
        session.execute(update(User).values(tokens_used_this_month=900))
    # when
    h.stepper.run(job_id, 0, "start")
    # then
    assert h.router.requests[0]["max_tokens"] == 100


# --- a tool turn ----------------------------------------------------------------------

def test_a_personas_approval_list_holds_its_call_and_the_persist_reads_no_persona(make):
    """The persona is read once, with the user and the conversation, by the step's first
    transaction: the persist that plans the turn's calls does not read it again."""
    # given a persona that holds math.evaluate for a person's approval
    h = make(calls(("math.evaluate", {"expression": "2+2"})))
    persona = h.add_persona(requires_approval=["math.evaluate"])
    job_id = h.submit(persona_id=persona)
    # when its first step runs
    with sql_sent(h.sessions.kw["bind"]) as statements:
        effects = h.stepper.run(job_id, 0, "start")
    # then the call waits for a person, nothing is dispatched
    assert not [e for e in effects if isinstance(e, DispatchTools)]
    (call,) = h.rows(ToolCall, job_id)
    assert (call.name, call.status) == ("math.evaluate", "awaiting")
    job = h.job(job_id)
    assert (job.status, job.waiting_for) == ("waiting", "approval")
    # and the persona was read by one statement of the step (its first transaction's)
    assert len([sql for sql in statements if "FROM personas" in sql
                or "JOIN personas" in sql]) == 1


def test_a_tool_call_is_dispatched_then_its_result_feeds_the_next_turn(make):
    # given a model that computes with a tool, then answers
    h = make(calls(("math.evaluate", {"expression": "2+2"}), content="Computing."), text("4"))
    job_id = h.submit()
    # when the first step runs
    effects = h.stepper.run(job_id, 0, "start")
    # then it asks for the tool to run on the math queue
    (effect,) = effects
    assert isinstance(effect, DispatchTools)
    assert (effect.job_id, effect.iteration) == (job_id, 1)
    ((tool_use_id, queue, limit),) = effect.calls
    assert queue == "tools.math" and limit == 5
    (call,) = h.rows(ToolCall, job_id)
    assert (call.tool_use_id, call.status, call.name) == (tool_use_id, "pending", "math.evaluate")
    assert h.job(job_id).status == "running"

    # when the tool runs and the callback step follows
    outcome = execute_tool_call(tool_use_id, h.settings, h.registry, h.sessions)
    end = h.stepper.run(job_id, 1, "callback")
    # then
    assert outcome.status == "succeeded"
    assert end == [JobEnded(job_id, "completed")]
    job = h.job(job_id)
    assert (job.status, job.finish_reason, job.response["content"]) == ("completed",
                                                                       "end_turn", "4")
    assert job.response["metadata"]["tool_calls"] == [
        {"name": "math.evaluate", "success": True, "tool_use_id": tool_use_id,
         "status": "succeeded", "arguments": {"expression": "2+2"},
         "result": {"expression": "2+2", "result": 4}, "error": None, "truncated": False}]
    roles = [m.role for m in h.rows(Message, job_id, Message.seq)]
    assert roles == ["user", "assistant", "tool_call", "tool_result", "assistant"]
    result = json.loads(h.rows(Message, job_id, Message.seq)[3].content)
    assert (result["tool_use_id"], result["ok"], result["result"]["result"]) == (
        tool_use_id, True, 4)
    # and the second model call read the result as a tool message
    tool_messages = [m for m in h.router.requests[1]["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == [tool_use_id]
    assert json.loads(tool_messages[0]["content"])["result"] == 4
    assert len(h.rows(TokenLog, job_id)) == 2
    assert h.user_of(job_id).tokens_used_this_month == 30


def test_a_step_after_tools_reads_its_own_messages_and_the_history_in_one_statement(make):
    # given a conversation with one job answered, and a second job in it whose first turn
    # ran a tool
    h = make(text("first answer"), calls(("math.evaluate", {"expression": "6*7"})),
             text("42"))
    h.drive(h.submit("first question", thread="t-history"))
    job_id = h.submit("What is 6*7?", thread="t-history")
    (dispatch,) = h.stepper.run(job_id, 0, "start")
    ((tool_use_id, _, _),) = dispatch.calls
    execute_tool_call(tool_use_id, h.settings, h.registry, h.sessions)
    # when the step after its tools runs
    with sql_sent(h.sessions.kw["bind"]) as statements:
        effects = h.stepper.run(job_id, 1, "callback")
    # then the model was sent the history, the question, the call and its result, in order
    assert effects == [JobEnded(job_id, "completed")]
    messages = h.router.requests[-1]["messages"]
    assert [(m["role"], m.get("content")) for m in messages[1:4]] == [
        ("user", "first question"), ("assistant", "first answer"),
        ("user", "What is 6*7?")]
    assert [m["role"] for m in messages[4:]] == ["assistant", "tool"]
    assert json.loads(messages[5]["content"])["result"] == 42
    # and the job's messages and the history before its question were one read
    reads = [s for s in statements if "FROM messages" in s and "INSERT" not in s]
    assert len(reads) == 1


def test_answer_after_tools_offers_no_tools_after_a_turn_whose_calls_all_succeeded(make):
    # given the setting `agentq run` uses with the local model, and a model that calls two
    # tools that both succeed, then answers
    h = make(calls(("math.evaluate", {"expression": "6*7"}),
                   ("math.evaluate", {"expression": "1+1"})), text("42"),
             AGENTQ_ANSWER_AFTER_TOOLS="1")
    job_id = h.submit("What is 6*7?")
    # when the job runs to its end
    h.drive(job_id)
    # then the first call offered the tools, the one after the results offered none
    first, second = h.router.requests
    assert "math.evaluate" in first["tools"]
    assert second["tools"] == []
    assert [m["role"] for m in second["messages"]][-2:] == ["tool", "tool"]
    assert h.job(job_id).response["content"] == "42"


def test_answer_after_tools_still_offers_them_after_a_failed_call(make):
    # given the same setting, and a turn with one call that succeeds and one that fails
    h = make(calls(("math.evaluate", {"expression": "6*7"}), ("no.such_tool", {})),
             text("42"), AGENTQ_ANSWER_AFTER_TOOLS="1")
    job_id = h.submit("What is 6*7?")
    h.drive(job_id)
    # then the model may try again: the tools are offered after that turn
    assert "math.evaluate" in h.router.requests[1]["tools"]


def test_without_answer_after_tools_the_tools_are_offered_after_results(make):
    h = make(calls(("math.evaluate", {"expression": "6*7"})), text("42"))
    h.drive(h.submit("What is 6*7?"))
    assert "math.evaluate" in h.router.requests[1]["tools"]


def test_running_the_same_step_twice_does_nothing_the_second_time(make):
    # given a job whose first step already ran
    h = make(calls(("math.evaluate", {"expression": "1+1"})))
    job_id = h.submit()
    first = h.stepper.run(job_id, 0, "start")
    before = (len(h.rows(Message, job_id)), len(h.rows(ToolCall, job_id)),
              len(h.rows(TokenLog, job_id)))
    # when the same step is delivered again
    second = h.stepper.run(job_id, 0, "start")
    # then no second model call (it would fail the test), and no new rows
    assert len(first) == 1 and second == []
    assert len(h.router.requests) == 1
    assert (len(h.rows(Message, job_id)), len(h.rows(ToolCall, job_id)),
            len(h.rows(TokenLog, job_id))) == before


def test_a_finished_job_ignores_a_late_step(make):
    # given a completed job
    h = make(text("done"))
    job_id = h.submit()
    h.stepper.run(job_id, 0, "start")
    # when its next step arrives anyway
    late = h.stepper.run(job_id, 1, "sweeper")
    # then
    assert late == []
    assert h.job(job_id).status == "completed"


def test_a_duplicate_step_while_the_first_waits_for_the_model_does_nothing(make):
    # given a step whose model call is in flight when its duplicate arrives
    h = make()
    job_id = h.submit()
    duplicate = []

    def in_flight():
        duplicate.extend(h.stepper.run(job_id, 0, "start") or ["skipped"])
        return text("4")

    h.router.replies.append(in_flight)
    # when
    effects = h.stepper.run(job_id, 0, "start")
    # then the duplicate claimed nothing and the first step finished the job once
    assert duplicate == ["skipped"]
    assert effects == [JobEnded(job_id, "completed")]
    assert len(h.rows(Message, job_id)) == 2
    assert len(h.rows(TokenLog, job_id)) == 1


def test_a_step_that_lost_its_lease_discards_its_reply(make):
    # given a step whose model is so slow that the sweeper re-drives the job meanwhile
    h = make(AGENTQ_STEP_DEADLINE_S="1")
    job_id = h.submit()
    redriven = []

    def slow_reply():
        with h.sessions() as session, session.begin():
            session.execute(update(Job).values(
                step_lease_until=utcnow() - timedelta(seconds=1),
                last_progress_at=utcnow() - timedelta(seconds=60)))
        for effect in h.sweep():
            redriven.extend(h.stepper.run(effect.job_id, effect.iteration, effect.cause))
        return text("late answer")

    h.router.replies.extend([slow_reply, text("on-time answer")])
    # when
    effects = h.stepper.run(job_id, 0, "start")
    # then the re-driven step finished the job; the late reply changed nothing
    assert redriven == [JobEnded(job_id, "completed")]
    assert effects == []
    job = h.job(job_id)
    assert (job.status, job.response["content"], job.iteration) == (
        "completed", "on-time answer", 1)
    assert [m.content for m in h.rows(Message, job_id, Message.seq)] == [
        "What is 2+2?", "on-time answer"]
    assert len(h.rows(TokenLog, job_id)) == 1


# --- the loop's limits ----------------------------------------------------------------

def test_max_iterations_ends_a_job_that_keeps_calling_tools(make):
    # given a model that always calls a tool, and at most two model calls
    h = make(forever=calls(("math.evaluate", {"expression": "1+1"}), content="Again."),
             AGENTQ_MAX_ITERATIONS="2")
    job_id = h.submit()
    # when
    effects = h.drive(job_id)
    # then
    assert effects[-1] == JobEnded(job_id, "completed")
    job = h.job(job_id)
    assert (job.status, job.finish_reason, job.iteration) == ("completed", "max_iterations", 2)
    assert len(h.router.requests) == 2
    assert job.response["error"]["code"] == "max_iterations"
    assert job.response["content"] == "Again."  # the last thing the model said
    calls_ = h.rows(ToolCall, job_id)
    assert [c.status for c in calls_] == ["succeeded", "succeeded"]


def test_an_exhausted_budget_fails_the_job_without_a_model_call(make):
    # given a guest who already used the whole monthly budget
    h = make(AGENTQ_GUEST_MONTHLY_TOKENS="500")
    job_id = h.submit()
    with h.sessions() as session, session.begin():
        session.execute(update(User).values(tokens_used_this_month=500))
    # when
    effects = h.stepper.run(job_id, 0, "start")
    # then
    assert effects == [JobEnded(job_id, "failed")]
    assert h.router.requests == []
    job = h.job(job_id)
    assert (job.status, job.finish_reason) == ("failed", "budget_exceeded")
    assert job.response["error"]["code"] == "budget_exceeded"
    assert job.response["error"]["used"] == 500
    assert h.rows(TokenLog, job_id) == []


def test_a_provider_error_fails_the_job(make):
    # given a model that cannot be reached
    h = make(ProviderError("every model failed", [{"model": MODEL, "error": "503"}]))
    job_id = h.submit()
    # when
    effects = h.stepper.run(job_id, 0, "start")
    # then
    assert effects == [JobEnded(job_id, "failed")]
    job = h.job(job_id)
    assert (job.status, job.finish_reason) == ("failed", "error")
    assert job.response["error"]["code"] == "provider_error"
    assert job.error == "every model failed"
    assert h.rows(TokenLog, job_id) == []


def test_a_cancelled_job_ends_before_the_model_is_called(make):
    # given a job cancelled before its first step
    h = make()
    job_id = h.submit()
    with h.sessions() as session, session.begin():
        session.execute(update(Job).values(cancel_requested_at=utcnow()))
    # when
    effects = h.stepper.run(job_id, 0, "start")
    # then
    assert effects == [JobEnded(job_id, "cancelled")]
    assert (h.job(job_id).status, h.job(job_id).finish_reason) == ("cancelled", "cancelled")


# --- tool calls the model gets wrong ---------------------------------------------------

def test_an_unknown_tool_gets_an_error_result_and_the_loop_goes_on(make):
    # given a model that calls a tool that does not exist, then answers
    h = make(calls(("web.search", {"q": "news"})), text("I cannot search, sorry."))
    job_id = h.submit()
    # when
    effects = h.stepper.run(job_id, 0, "start")
    # then nothing is dispatched; the next step follows directly
    assert effects == [NextStep(job_id, 1, "continue")]
    (call,) = h.rows(ToolCall, job_id)
    assert (call.status, call.result["error"]["code"]) == ("failed", "tool_not_found")

    # when the next step runs
    end = h.stepper.run(job_id, 1, "continue")
    # then the model read the error and the job completed
    assert end == [JobEnded(job_id, "completed")]
    (tool_message,) = [m for m in h.router.requests[1]["messages"] if m["role"] == "tool"]
    assert json.loads(tool_message["content"])["error"]["code"] == "tool_not_found"
    job = h.job(job_id)
    assert job.response["content"] == "I cannot search, sorry."
    assert job.response["metadata"]["tool_calls"][0]["success"] is False


def test_a_guest_calling_a_tool_above_its_level_gets_tool_not_found(make):
    # given a guest's model that calls code.run_python (not offered to guests)
    h = make(calls(("code.run_python", {"code": "print(1)"})), text("ok"))
    job_id = h.submit()
    # when
    effects = h.drive(job_id)
    # then
    assert effects[-1] == JobEnded(job_id, "completed")
    (call,) = h.rows(ToolCall, job_id)
    assert call.result["error"]["code"] == "tool_not_found"


def test_arguments_that_are_not_json_are_answered_without_dispatching(make):
    # given a model whose tool call arguments could not be parsed
    bad = LLMReply("", (ToolCallRequest("call_0", "math.evaluate", None, "{2+2",
                                        "Expecting property name"),), "tool_use", MODEL, 10, 5)
    h = make(bad, text("Sorry."))
    job_id = h.submit()
    # when
    effects = h.stepper.run(job_id, 0, "start")
    h.stepper.run(job_id, 1, "continue")
    # then
    assert effects == [NextStep(job_id, 1, "continue")]
    (call,) = h.rows(ToolCall, job_id)
    assert call.result["error"]["code"] == "invalid_arguments"
    assert h.job(job_id).status == "completed"


def test_a_callback_with_a_call_still_pending_answers_it_as_lost(make):
    # given a turn of two calls of which only one stored a result
    h = make(calls(("math.evaluate", {"expression": "1+1"}), ("time.now", {})), text("ok"))
    job_id = h.submit()
    (dispatch,) = h.stepper.run(job_id, 0, "start")
    first, second = (c[0] for c in dispatch.calls)
    execute_tool_call(first, h.settings, h.registry, h.sessions)
    # when the callback step runs anyway (the other task was lost)
    end = h.stepper.run(job_id, 1, "errback")
    # then the lost call is answered with an error, and the loop goes on
    assert end == [JobEnded(job_id, "completed")]
    statuses = {c.tool_use_id: (c.status, (c.result.get("error") or {}).get("code"))
                for c in h.rows(ToolCall, job_id)}
    assert statuses == {first: ("succeeded", None), second: ("failed", "tool_task_failed")}
    # and a late execution of the lost call stores nothing
    assert execute_tool_call(second, h.settings, h.registry, h.sessions).status == "failed"


def test_the_sweeper_redispatches_tool_calls_that_never_ran(make):
    # given a job waiting for a tool call whose task was lost
    h = make(calls(("math.evaluate", {"expression": "3*3"})), text("9"),
             AGENTQ_STEP_DEADLINE_S="1")
    job_id = h.submit()
    (dispatch,) = h.stepper.run(job_id, 0, "start")
    h.backdate(job_id)
    # when the sweeper re-drives it
    (redrive,) = h.sweep()
    again = h.stepper.run(redrive.job_id, redrive.iteration, redrive.cause)
    # then the same call goes out again, and the job completes once it runs
    assert redrive == NextStep(job_id, 1, "sweeper")
    assert again == [dispatch]
    execute_tool_call(dispatch.calls[0][0], h.settings, h.registry, h.sessions)
    assert h.stepper.run(job_id, 1, "callback") == [JobEnded(job_id, "completed")]
    assert h.job(job_id).response["content"] == "9"


def test_a_large_tool_result_does_not_erase_the_question_from_the_next_turn(make):
    # given a stored 40,000-character document the model will read
    h = make(calls(("files.read_document", {"file_id": "?"})), text("A summary."))
    job_id = h.submit("Summarise my document")
    file_id = uuid.uuid4()
    with h.sessions() as session, session.begin():
        session.add(FileRecord(id=file_id, tenant_id=h.job(job_id).tenant_id,
                               user_id=h.job(job_id).user_id, filename="doc.txt",
                               content=b"x" * 40_000))
    h.router.replies[0] = calls(("files.read_document", {"file_id": str(file_id)}))
    # when
    h.drive(job_id)
    # then the second model call still carries the question and the (cut) result
    second = h.router.requests[1]["messages"]
    assert {"role": "user", "content": "Summarise my document"} in second
    assert any(m["role"] == "tool" for m in second)


# --- files ----------------------------------------------------------------------------

def test_file_urls_in_tool_results_become_the_response_files(make):
    # given a model that writes a document, then answers
    h = make(calls(("files.create_document", {"title": "Report", "content": "# Hello"})),
             text("Here is your report."))
    job_id = h.submit("Write me a report")
    # when
    h.drive(job_id)
    # then
    job = h.job(job_id)
    assert job.status == "completed"
    (file,) = job.response["files"]
    assert file["filename"] == "Report.md"
    file_id = file["url"].rsplit("/", 1)[1]
    assert file["url"] == f"{h.settings.public_url}/v1/files/{file_id}"
    with h.sessions() as session:
        record = session.get(FileRecord, uuid.UUID(file_id))
        assert record.content == b"# Hello"
        assert str(record.job_id) == job_id


# --- the sweeper ----------------------------------------------------------------------

def test_the_sweeper_redrives_a_job_whose_first_step_never_ran(make):
    # given a queued job whose start message was lost
    h = make(text("recovered"), AGENTQ_STEP_DEADLINE_S="1")
    job_id = h.submit()
    fresh = h.submit("a fresh job", user="u-2", thread="t")
    h.backdate(job_id)
    # when
    effects = h.sweep()
    # then only the stalled job is re-driven, at its step
    assert effects == [NextStep(job_id, 0, "sweeper")]
    assert h.job(job_id).redrives == 1
    assert h.job(fresh).redrives == 0

    # when the re-driven step runs
    end = h.stepper.run(job_id, 0, "sweeper")
    # then the job completes
    assert end == [JobEnded(job_id, "completed")]
    assert h.job(job_id).response["content"] == "recovered"


def test_the_sweeper_fails_a_job_whose_step_crashes_past_max_redrives(make):
    # given a job whose step is taken by a worker that dies, every time
    h = make(AGENTQ_STEP_DEADLINE_S="1", AGENTQ_MAX_REDRIVES="2")
    job_id = h.submit()
    rounds = []
    for _ in range(3):
        with h.sessions() as session, session.begin():
            assert h.stepper._claim(session, uuid.UUID(job_id), 0, uuid.uuid4().hex)
            session.execute(update(Job).where(Job.id == uuid.UUID(job_id)).values(
                step_lease_until=utcnow() - timedelta(seconds=1)))
        h.backdate(job_id)
        rounds.append(h.sweep())
    # then
    assert rounds == [[NextStep(job_id, 0, "sweeper")], [NextStep(job_id, 0, "sweeper")],
                      [JobEnded(job_id, "failed")]]
    job = h.job(job_id)
    assert (job.status, job.finish_reason) == ("failed", "error")
    assert job.response["error"]["code"] == "stalled"
    assert h.router.requests == []
    # and a later sweep leaves the ended job alone
    h.backdate(job_id)
    assert h.sweep() == []


def test_an_empty_final_answer_still_ends_with_readable_text(make):
    # given a model that answers with no text and no tool calls
    h = make(text(""))
    job_id = h.submit("hi")
    # when the step runs
    h.stepper.run(job_id, 0, "start")
    # then the job completes with readable content and says why
    job = h.job(job_id)
    assert (job.status, job.finish_reason) == ("completed", "end_turn")
    assert job.response["content"].strip()
    assert job.response["error"]["code"] == "empty_answer"


def test_a_cancel_recorded_while_the_model_thinks_stops_its_call(make):
    """Issue 31 item 3: the cancel watch sees the cancel while the model call runs and sets
    the call's token (the real router then aborts it and raises CallCancelled, as here);
    the job ends cancelled at once, nothing of the call stored or billed."""
    from agentq.llm import cancel as llm_cancel
    from agentq.loop.cancel_watch import CancelWatch
    from agentq.loop.submit import cancel as cancel_job

    def thinking():
        token = llm_cancel.current()
        assert token is not None and not token.is_set()
        with uow.UnitOfWork(h.sessions) as unit:  # POST /v1/jobs/<id>/cancel meanwhile
            cancel_job(unit, unit.session.get(Job, uuid.UUID(job_id)))
        assert token.wait(30), "the cancel watch never set the token"
        raise llm_cancel.CallCancelled("aborted")

    h = make(thinking)
    h.stepper.cancels = CancelWatch(h.sessions, poll_s=0.05)
    job_id = h.submit()
    effects = h.stepper.run(job_id, 0, "start")
    assert effects == [JobEnded(job_id, "cancelled")]
    job = h.job(job_id)
    assert (job.status, job.finish_reason, job.iteration) == ("cancelled", "cancelled", 0)
    assert (job.input_tokens, job.output_tokens) == (0, 0)
    assert h.rows(TokenLog, job_id) == []
    with h.sessions() as session:
        kinds = list(session.execute(select(JobEvent.type).where(
            JobEvent.job_id == uuid.UUID(job_id)).order_by(JobEvent.seq)).scalars())
    assert kinds[-3:] == ["cancel_requested", "turn_end", "job_end"]


def test_a_cancel_watch_look_sets_the_tokens_of_the_cancelled_jobs_only(make):
    """One look for every step waiting for its model (the ids as one array on Postgres):
    the tokens of the jobs cancelled are set, the others' not, and a job watched by two
    steps has both set."""
    from agentq.loop.cancel_watch import CancelWatch
    h = make()
    jobs = [h.submit() for _ in range(4)]
    watch = CancelWatch(h.sessions, poll_s=3600)  # looks only when told here
    with contextlib.ExitStack() as held:
        tokens = [held.enter_context(watch.watch(job_id)) for job_id in jobs]
        twice = held.enter_context(watch.watch(jobs[2]))
        assert watch.look() == 0
        with h.sessions() as session, session.begin():  # what a cancel of a running job records
            session.execute(update(Job).where(Job.id.in_([uuid.UUID(jobs[0]),
                                                          uuid.UUID(jobs[2])]))
                            .values(cancel_requested_at=utcnow()))
        assert watch.look() == 3
        assert [t.is_set() for t in tokens] == [True, False, True, False]
        assert twice.is_set()
        assert watch.look() == 0  # a token is set once
