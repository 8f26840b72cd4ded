"""The context a turn sends: a window of the newest history, in the provider's format."""
from __future__ import annotations

import itertools
import json

from agentq.config import Settings
from agentq.loop.compaction_plan import after_summary, plan_compaction, turns
from agentq.loop.context import (
    Layers,
    StoredMessage,
    assemble,
    build,
    context_window,
    estimate_tokens,
    input_budget,
    render_tool_result,
    to_provider,
    tokens_of,
    truncate,
    window,
)
from tests.support.stored_messages import (
    assistant_message as _assistant,
)
from tests.support.stored_messages import (
    call_message as _call,
)
from tests.support.stored_messages import (
    in_run as _inrun,
)
from tests.support.stored_messages import (
    result_message as _result,
)
from tests.support.stored_messages import (
    user_message as _user,
)


def _newest_first(messages: list[StoredMessage]) -> list[StoredMessage]:
    return sorted(messages, key=lambda m: m.seq, reverse=True)


# --- window ---------------------------------------------------------------------------

def test_window_keeps_the_newest_messages_that_fit_oldest_first():
    # given ten alternating messages of 10 tokens each
    history = [(_user if i % 2 else _assistant)(i) for i in range(1, 11)]
    # when the budget holds four of them
    taken = window(_newest_first(history), max_tokens=40)
    # then the newest four are kept, oldest first, starting at a user message
    assert [m.seq for m in taken] == [7, 8, 9, 10]
    assert taken[0].role == "user"


def test_window_always_keeps_the_newest_message_even_over_budget():
    # given a newest user message far bigger than the budget
    history = [_user(1), _assistant(2), _user(3, "x" * 10_000, tokens=2500)]
    # when
    taken = window(_newest_first(history), max_tokens=100)
    # then
    assert [m.seq for m in taken] == [3]


def test_window_estimates_tokens_when_none_are_stored():
    # given messages with token_count 0
    history = [_user(1, "a" * 400, tokens=0), _assistant(2, "b" * 400, tokens=0),
               _user(3, "c" * 400, tokens=0)]
    each = estimate_tokens("a" * 400)
    # when the budget holds all three estimated messages, then one less
    whole = window(_newest_first(history), max_tokens=3 * each)
    short = window(_newest_first(history), max_tokens=3 * each - 1)
    # then
    assert [m.seq for m in whole] == [1, 2, 3]
    assert [m.seq for m in short] == [3]


def test_window_never_starts_with_a_tool_result():
    # given a history whose budget cut falls just after a tool call
    history = [_user(1), _call(2, "t1"), _result(3, "t1"), _assistant(4), _user(5),
               _assistant(6)]
    # when the budget reaches back to the tool result but not its call
    taken = window(_newest_first(history), max_tokens=40)
    # then the half exchange is dropped: the window opens at the next user message
    assert [m.seq for m in taken] == [5, 6]


def test_window_starts_at_a_user_message_not_in_the_middle_of_a_tool_exchange():
    # given
    history = [_user(1), _call(2, "t1"), _result(3, "t1"), _user(4), _call(5, "t2"),
               _result(6, "t2"), _assistant(7)]
    # when the budget reaches back into the first exchange (the call is cut off)
    taken = window(_newest_first(history), max_tokens=50)
    # then it starts at the next user message
    assert [m.seq for m in taken] == [4, 5, 6, 7]


def test_window_over_a_long_history_reads_only_what_fits():
    # given 10,000 stored messages, read lazily newest first
    consumed = itertools.count()

    def newest_first():
        for seq in range(10_000, 0, -1):
            next(consumed)
            yield (_user if seq % 2 else _assistant)(seq)

    # when
    taken = window(newest_first(), max_tokens=100)
    # then the window holds what fits and stopped reading right after it
    assert [m.seq for m in taken] == list(range(9_991, 10_001))
    assert next(consumed) <= 12


def test_window_keeps_the_newest_message_when_it_is_a_big_tool_result():
    # given a question, a tool call and a tool result bigger than the budget
    history = [_user(1, "Summarise the document"), _call(2, "t1"),
               _result(3, "t1", result="x" * 40_000, tokens=10_004)]
    # when
    taken = window(_newest_first(history), max_tokens=6_000)
    # then the newest message is kept (docstring: "The newest message is always kept")
    assert taken and taken[-1].seq == 3


def test_build_keeps_the_question_when_a_tool_result_is_large(tmp_path):
    # given the default settings and a tool result of 40,000 characters (read_document
    # returns up to 100,000), stored with its estimated token count
    settings = Settings.from_env({"AGENTQ_HOME": str(tmp_path)})
    big = json.dumps({"name": "files.read_document", "tool_use_id": "t1", "ok": True,
                      "result": {"content": "x" * 40_000}, "error": None})
    history = [StoredMessage(1, "user", "Summarise the document", 10),
               _call(2, "t1", name="files.read_document", arguments={"file_id": "f"}),
               StoredMessage(3, "tool_result", big, estimate_tokens(big))]
    # when
    messages = build("You help.", _newest_first(history),
                     max_tokens=settings.context_max_tokens,
                     max_tool_chars=settings.tool_result_max_chars)
    # then the model still sees the question and the (truncated) result
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]


# --- to_provider ----------------------------------------------------------------------

def test_assistant_text_and_its_tool_calls_become_one_assistant_message():
    # given
    rows = [_user(1, "What is 1+1 and 2+2?"), _assistant(2, "Let me compute."),
            _call(3, "t1", arguments={"expression": "1+1"}),
            _call(4, "t2", arguments={"expression": "2+2"}),
            _result(5, "t1", result=2), _result(6, "t2", result=4), _assistant(7, "2 and 4.")]
    # when
    messages = to_provider(rows, max_tool_chars=1000)
    # then
    assert messages == [
        {"role": "user", "content": "What is 1+1 and 2+2?"},
        {"role": "assistant", "content": "Let me compute.", "tool_calls": [
            {"id": "t1", "type": "function",
             "function": {"name": "math.evaluate", "arguments": '{"expression": "1+1"}'}},
            {"id": "t2", "type": "function",
             "function": {"name": "math.evaluate", "arguments": '{"expression": "2+2"}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "2"},
        {"role": "tool", "tool_call_id": "t2", "content": "4"},
        {"role": "assistant", "content": "2 and 4."},
    ]


def test_tool_calls_without_assistant_text_get_an_assistant_message_of_their_own():
    # given
    rows = [_user(1), _call(2, "t1"), _result(3, "t1", result={"value": 2})]
    # when
    messages = to_provider(rows, max_tool_chars=1000)
    # then
    assert messages[1]["role"] == "assistant"
    assert messages[1]["content"] is None
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["t1"]
    assert messages[2] == {"role": "tool", "tool_call_id": "t1", "content": '{"value": 2}'}


def test_invalid_arguments_are_sent_back_as_an_empty_object():
    # given a call whose arguments were not JSON (stored as null)
    rows = [_user(1), _call(2, "t1", arguments={}),
            _result(3, "t1", ok=False, error={"code": "invalid_arguments", "message": "bad"})]
    rows[1] = StoredMessage(2, "tool_call", json.dumps(
        {"name": "math.evaluate", "arguments": None, "tool_use_id": "t1"}), 10)
    # when
    messages = to_provider(rows, max_tool_chars=1000)
    # then
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == "{}"


def test_orphan_tool_calls_and_orphan_results_are_dropped():
    # given a call without a result (t1), a result without a call (t9), and an answered call
    rows = [_user(1), _call(2, "t1"), _user(3), _assistant(4, "checking"), _call(5, "t2"),
            _call(6, "t3"), _result(7, "t2"), _result(8, "t9"), _assistant(9, "done")]
    # when
    messages = to_provider(rows, max_tool_chars=1000)
    # then the empty assistant message of t1 vanishes, t3 and t9 are gone
    assert [m["role"] for m in messages] == ["user", "user", "assistant", "tool", "assistant"]
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["t2"]
    assert [m["tool_call_id"] for m in messages if m["role"] == "tool"] == ["t2"]


def test_an_assistant_text_whose_calls_all_lack_results_keeps_its_text():
    # given
    rows = [_user(1), _assistant(2, "I will look it up."), _call(3, "t1")]
    # when
    messages = to_provider(rows, max_tool_chars=1000)
    # then
    assert messages[-1] == {"role": "assistant", "content": "I will look it up."}


# --- truncate and render_tool_result ----------------------------------------------------

def test_truncate_leaves_short_text_alone():
    # given / when / then
    assert truncate("short", 5) == "short"
    assert truncate("", 5) == ""


def test_truncate_cuts_and_says_how_much():
    # given / when
    cut = truncate("a" * 120, 100)
    # then
    assert cut.startswith("a" * 100)
    assert not cut.startswith("a" * 101)
    assert cut.endswith("[truncated 20 chars]")


def test_an_error_result_is_rendered_as_json_with_error():
    # given
    record = {"ok": False, "result": None,
              "error": {"code": "tool_timeout", "message": "too slow"}}
    # when
    text = render_tool_result(record, max_chars=1000)
    # then
    assert json.loads(text) == {"error": {"code": "tool_timeout", "message": "too slow"}}


def test_an_error_without_details_still_says_error():
    # given / when
    text = render_tool_result({"ok": False}, max_chars=1000)
    # then
    assert "error" in json.loads(text)


def test_a_result_is_json_unless_it_is_already_text():
    # given / when / then
    assert render_tool_result({"ok": True, "result": {"a": "é"}}, 1000) == '{"a": "é"}'
    assert render_tool_result({"ok": True, "result": "plain"}, 1000) == "plain"


def test_a_result_longer_than_the_limit_is_cut():
    # given
    record = {"ok": True, "result": "z" * 5000}
    # when
    text = render_tool_result(record, max_chars=100)
    # then
    assert text.startswith("z" * 100)
    assert "[truncated 4900 chars]" in text
    assert len(text) < 200


def test_a_long_json_result_is_cut_into_valid_json():
    # given a sandbox result whose stdout and stderr together pass the limit (issue 9)
    record = {"ok": True, "result": {"stdout": "x" * 6000 + "\n" * 500, "stderr": "e" * 3000,
                                     "exit_code": 0, "truncated": False}}
    # when
    text = render_tool_result(record, max_chars=8000)
    # then it parses, keeps every field, and says where it was cut
    result = json.loads(text)
    assert len(text) <= 8000
    assert result["exit_code"] == 0 and result["stderr"] == "e" * 3000
    assert result["stdout"].startswith("x" * 1000) and "[truncated " in result["stdout"]


def test_a_json_result_of_many_small_values_still_parses():
    # given
    record = {"ok": True, "result": list(range(5000))}
    # when
    text = render_tool_result(record, max_chars=300)
    # then
    assert len(text) <= 300 and json.loads(text)["truncated"] is True


def test_a_tool_message_in_the_context_is_cut_to_the_limit():
    # given
    rows = [_user(1), _call(2, "t1"), _result(3, "t1", result="y" * 500)]
    # when
    messages = to_provider(rows, max_tool_chars=100)
    # then
    assert messages[-1]["content"].endswith("[truncated 400 chars]")


# --- build ----------------------------------------------------------------------------

def test_build_puts_the_system_prompt_first_then_the_window():
    # given
    history = [_user(1, "old"), _assistant(2, "old answer"), _user(3, "new question")]
    # when
    messages = build("You are terse.", _newest_first(history), max_tokens=1000,
                     max_tool_chars=1000)
    # then
    assert messages == [{"role": "system", "content": "You are terse."},
                        {"role": "user", "content": "old"},
                        {"role": "assistant", "content": "old answer"},
                        {"role": "user", "content": "new question"}]


def test_build_with_no_history_is_only_the_system_prompt():
    # given / when / then
    assert build("S", [], max_tokens=100, max_tool_chars=100) == [
        {"role": "system", "content": "S"}]


def test_last_tools_succeeded_reads_the_newest_turn_only():
    from agentq.loop.context import last_tools_succeeded
    from agentq.loop.store import StoredMessage

    def result(seq, ok):
        return StoredMessage(seq, "tool_result", json.dumps({"name": "math.evaluate",
                                                             "tool_use_id": f"t{seq}",
                                                             "ok": ok}), 5)
    call = StoredMessage(2, "tool_call", "{}", 5)
    user = StoredMessage(1, "user", "What is 6*7?", 5)
    # newest first, as recent_messages returns them
    assert last_tools_succeeded([result(4, True), result(3, True), call, user])
    assert not last_tools_succeeded([result(4, True), result(3, False), call, user])
    assert not last_tools_succeeded([user])
    assert not last_tools_succeeded([StoredMessage(5, "assistant", "42", 1), result(4, True)])


# --- layered assembly and compaction ---------------------------------------------------


def test_the_question_survives_any_number_of_in_run_messages():
    # given 300 turns of ten calls each after the question (6,000 rows)
    layers = Layers("sys", None, [], _user(1, "the question"), _inrun(2, 300, 10))
    # when assembled with a tiny budget
    messages = assemble(layers, budget=500, history_max_tokens=100, max_tool_chars=100)
    # then the question is there, after the system prompt, and every call has its result
    assert messages[1] == {"role": "user", "content": "the question"}
    asked = {c["id"] for m in messages if m["role"] == "assistant" for c in m["tool_calls"]}
    assert asked == {m["tool_call_id"] for m in messages if m["role"] == "tool"}
    assert len(asked) == 3000


def test_layers_come_in_the_seeds_order():
    history = [_user(1, "old q"), _assistant(2, "old a")]
    layers = Layers("sys", "they talked", history, _user(3, "now"), _inrun(4, 1),
                    memories=("likes tea",))
    messages = assemble(layers, budget=10_000, history_max_tokens=1000, max_tool_chars=100)
    system = messages[0]["content"]
    assert system.index("sys") < system.index("likes tea") < system.index("they talked")
    assert [m.get("content") for m in messages[1:4]] == ["old q", "old a", "now"]
    assert messages[4]["role"] == "assistant" and messages[5]["role"] == "tool"


def test_history_gets_only_the_room_left_and_starts_at_a_user_message():
    history = [(_user if i % 2 == 0 else _assistant)(i, tokens=100) for i in range(1, 21)]
    layers = Layers("sys", None, history, _user(100, "now"), [])
    messages = assemble(layers, budget=450, history_max_tokens=10_000, max_tool_chars=100)
    assert messages[-1]["content"] == "now"
    assert messages[1]["role"] == "user"
    assert len(messages) - 2 <= 4


def test_under_the_threshold_nothing_is_compacted():
    layers = Layers("sys", None, [], _user(1), _inrun(2, 3))
    assert plan_compaction(layers, 10_000, 0.8, 1000, 2) is None


def test_old_tool_results_are_pruned_first_then_older_turns_summarised():
    big = "y" * 400
    layers = Layers("sys", None, [], _user(1), _inrun(2, 10, result=big))
    full = tokens_of(layers, 10_000)
    # pruning is enough when the old results are what takes the room
    plan = plan_compaction(layers, int(full * 0.9), 0.8, 10_000, 2)
    assert plan is not None and plan.summarize == ()
    assert plan.stub_before_seq == turns(layers.inrun)[-2][0].seq
    assert tokens_of(layers, 10_000, plan.stub_before_seq) < full
    pruned = assemble(layers, budget=full, history_max_tokens=0, max_tool_chars=10_000,
                      stub_before=plan.stub_before_seq)
    tool_texts = [m["content"] for m in pruned if m["role"] == "tool"]
    assert sum("pruned" in t for t in tool_texts) == 8
    # with a window too small even for stubs, the older turns are summarised
    plan = plan_compaction(layers, 150, 0.8, 10_000, 2)
    assert plan is not None and len(plan.summarize) == 16
    after = after_summary(layers, "short", plan.summarize[-1].seq)
    assert [m.seq for m in after.inrun] == [m.seq for m in layers.inrun[16:]]
    assert after.question == layers.question


def test_context_window_table_and_overrides():
    settings = Settings.from_env({})
    assert context_window("gpt-4o-mini", settings) == 128_000
    assert context_window("openai/gpt-4o-2024-08-06", settings) == 128_000
    assert context_window("unknown-model", settings) == 8_192
    settings = Settings.from_env({"AGENTQ_MODEL_CONTEXT_WINDOWS": "unknown-model=2048"})
    assert context_window("unknown-model", settings) == 2048
    assert context_window("anything", Settings.from_env({"AGENTQ_CONTEXT_WINDOW": "999"})) == 999
    assert input_budget(4000, None) == 3000 and input_budget(100_000, 500) == 99_500


def test_a_summary_is_cut_to_its_budget_at_a_word():
    """Issue 31 item 10: what the server sent past the summary's budget is not stored."""
    from agentq.loop.compaction_plan import cut_summary
    from agentq.loop.context import estimate_tokens
    short = "the user asked for sums"
    assert cut_summary(short, 256) == (short, False)
    long = "fact " * 2000
    kept, cut = cut_summary(long, 256)
    assert cut and estimate_tokens(kept) <= 256 and kept.endswith("fact")
    assert long.startswith(kept)
