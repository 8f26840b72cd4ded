"""A compaction strategy installed as a package (group `agentq.compaction`, chosen by
AGENTQ_COMPACTION_STRATEGY), and the after_compaction and after_loop hooks: a stack of its
own with tests/support/hooks_dist on its path (a site directory holding the installed
distributions agentq-test-hooks and agentq-test-compaction) and a small context window, so
that a conversation's history soon passes the compaction threshold."""
from __future__ import annotations

import pytest

from agentq.testing.scripted_llm import text
from tests.support.api import TEST_ENV, Client, uid
from tests.support.hook_log import DIST, _calls
from tests.support.stack import own_stack

pytestmark = pytest.mark.integration
LONG = "Here is some background. " * 50  # about 1,250 characters


@pytest.fixture(scope="module")
def strategy_stack(servers_up, llm, tmp_path_factory):
    hook_log = tmp_path_factory.mktemp("strategy-log") / "calls.jsonl"
    with own_stack("strategy", llm.base_url, tmp_path_factory.mktemp("strategy"),
                   {**TEST_ENV, "AGENTQ_TEST_HOOK_LOG": str(hook_log),
                    "AGENTQ_COMPACTION_STRATEGY": "keep_last",
                    "AGENTQ_CONTEXT_WINDOW": "1024"}, pythonpath=DIST) as stack:
        yield stack, Client(stack, stack.create_key("strategy", admin=True)), hook_log


def test_an_installed_strategy_compacts_and_the_hooks_hear_it(strategy_stack, llm):
    stack, client, hook_log = strategy_stack
    key = uid("strat").replace("-", "_")
    llm.script(key, [text("noted one"), text("noted two"), text("noted three"),
                     text("the answer")])
    first = client.wait(client.submit(f"script:{key} one {LONG}")["id"])
    conversation = first["conversation_id"]
    for word in ("two", "three"):
        made = client.post("/v1/continue", json={"conversation_id": conversation,
                                                 "content": f"script:{key} {word} {LONG}"})
        assert client.wait(made.json()["id"])["status"] == "completed"
    made = client.post("/v1/continue", json={"conversation_id": conversation,
                                             "content": f"script:{key} so what?"})
    last = client.wait(made.json()["id"])
    assert (last["status"], last["response"]["content"]) == ("completed", "the answer"), last

    # the model got what the strategy returned: the system prompt, its note, the newest two
    sent = llm.requests(key)[-1]["messages"]
    others = [m for m in sent if m["role"] != "system"]
    assert [m["role"] for m in others] == ["assistant", "user"]
    assert others[-1]["content"].endswith("so what?")
    notes = [m["content"] for m in sent if m["role"] == "system"
             and str(m["content"]).startswith("[compacted by keep_last:")]
    assert len(notes) == 1, sent
    # its events say which strategy ran, and what it saved
    ends = [e["data"] for e in client.events(last["id"]) if e["type"] == "compaction_end"]
    assert len(ends) == 1 and ends[0]["strategy"] == "keep_last"
    assert ends[0]["tokens_after"] < ends[0]["tokens_before"]
    assert ends[0]["messages_after"] == len(sent)
    # the hooks: after_compaction with the same figures, after_loop with the loop's usage
    compacted = _calls(hook_log, last["id"], expect=1, hooks=("after_compaction",))
    assert [{k: c[k] for k in ("strategy", "tokens_before", "tokens_after",
                               "messages_before", "messages_after")}
            for c in compacted] == [{k: ends[0][k] for k in (
                "strategy", "tokens_before", "tokens_after", "messages_before",
                "messages_after")}]
    ended = _calls(hook_log, last["id"], expect=1, hooks=("after_loop",))
    assert len(ended) == 1
    assert ended[0]["status"] == "completed" and ended[0]["finish_reason"] == "end_turn"
    assert ended[0]["usage"]["input_tokens"] == last["usage"]["input_tokens"] > 0
    assert ended[0]["usage"]["output_tokens"] == last["usage"]["output_tokens"]
    assert ended[0]["turns"] == 1
    llm.assert_done(key)
