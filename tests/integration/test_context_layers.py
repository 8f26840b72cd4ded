"""Context layers (issue 36; seed 002's order: system, bootstrap, memory, skills, tool
documentation, history, current message; seed 003's active project): a persona's bootstrap
text, skills and tool documentation, a tenant's default bootstrap and skills under them, a
conversation's active project set over the API, as the model's request shows them."""
from __future__ import annotations

import uuid

import pytest

from agentq.testing.scripted_llm import call, text, tool_calls
from tests.support.api import Client, uid

pytestmark = pytest.mark.integration


def test_the_context_holds_the_layers_in_seed_order(stack, llm):
    client = Client(stack, stack.create_key("layers", admin=True,
                                            tenant=stack.create_tenant(uid("layers-t"))))
    made = client.post("/v1/personas", json={
        "name": "Layered", "system_prompt": "SYSTEM-MARK you help.",
        "bootstrap": "BOOTSTRAP-MARK the team ships on Fridays.",
        "allowed_modules": ["math", "memory"], "tool_docs": True,
        "skills": [{"name": "arithmetic", "instructions": "SKILL-MARK check sums twice.",
                    "tools": ["math.evaluate"]},
                   {"name": "ghost", "instructions": "GHOST-MARK never offered.",
                    "tools": ["nope.tool"]}]})
    assert made.status_code == 201, made.text
    persona = made.json()
    assert persona["tool_docs"] is True and persona["bootstrap"].startswith("BOOTSTRAP")
    assert [s["name"] for s in persona["skills"]] == ["arithmetic", "ghost"]

    key = uid("layers").replace("-", "_")
    llm.script(key, [tool_calls(call("memory.remember",
                                     {"content": "MEMORY-MARK likes tea"})),
                     # the recall's embedding of the first question (it holds the marker)
                     text("(an embedding)"),
                     text("noted"), text("the answer")])
    first = client.wait(client.submit(f"script:{key} remember that I like tea",
                                      persona_id=persona["id"])["id"])
    assert first["status"] == "completed" and first["response"]["content"] == "noted", first
    conversation = first["conversation_id"]
    patched = client.http.patch(client.url(f"/v1/conversations/{conversation}"),
                                json={"active_project": "PROJECT-MARK the Q3 report"},
                                timeout=70)
    assert patched.status_code == 200, patched.text
    assert patched.json()["active_project"] == "PROJECT-MARK the Q3 report"
    assert client.get(f"/v1/conversations/{conversation}").json()[
        "active_project"] == "PROJECT-MARK the Q3 report"
    second = client.post("/v1/continue", json={"conversation_id": conversation,
                                               "content": "CURRENT-MARK what now?"})
    assert second.status_code == 202, second.text
    assert client.wait(second.json()["id"])["response"]["content"] == "the answer"

    sent = llm.requests(key)[-1]["messages"]
    system = sent[0]
    assert system["role"] == "system"
    body = system["content"]
    marks = ["SYSTEM-MARK", "BOOTSTRAP-MARK", "MEMORY-MARK", "SKILL-MARK",
             "[Tool documentation]", "PROJECT-MARK"]
    positions = [body.find(m) for m in marks]
    assert -1 not in positions, body
    assert positions == sorted(positions), body  # system, bootstrap, memory, skills, tools
    assert "- math.evaluate:" in body and "- memory.remember:" in body
    assert "GHOST-MARK" not in body  # its tool is not offered
    # then the history, then the current message, last
    rest = [(m["role"], m.get("content")) for m in sent[1:]]
    assert rest[0] == ("user", f"script:{key} remember that I like tea")
    assert rest[-1] == ("user", "CURRENT-MARK what now?")
    assert ("assistant", "noted") in rest
    llm.assert_done(key)

    # the project cleared; bad bodies; another tenant's conversation
    path = client.url(f"/v1/conversations/{conversation}")
    cleared = client.http.patch(path, json={"active_project": None}, timeout=70)
    assert cleared.status_code == 200 and cleared.json()["active_project"] is None
    for body in ({}, {"active_project": 3}, {"active_project": "x", "surprise": 1}):
        refused = client.http.patch(path, json=body, timeout=70)
        assert refused.status_code == 422, (body, refused.text)
    assert client.http.patch(client.url(f"/v1/conversations/{uuid.uuid4()}"),
                             json={"active_project": "x"}, timeout=70).status_code == 404
    stranger = Client(stack, stack.create_key("layers-other", admin=True,
                                              tenant=stack.create_tenant(uid("layers-o"))))
    assert stranger.http.patch(path, json={"active_project": "x"},
                               timeout=70).status_code == 404
    bad = client.post("/v1/personas", json={"name": "Bad", "skills": [{"name": "x"}]})
    assert bad.status_code == 422, bad.text


def test_a_tool_sets_the_active_project_for_the_next_turns(stack, llm):
    client = Client(stack, stack.create_key("layers-tool", admin=True,
                                            tenant=stack.create_tenant(uid("layers-p"))))
    persona = client.post("/v1/personas", json={"name": "Planner",
                                                "allowed_modules": ["projects"]}).json()
    key = uid("project").replace("-", "_")
    llm.script(key, [tool_calls(call("projects.set_active",
                                     {"project": "TOOL-PROJECT the migration"})),
                     text("set")])
    job = client.wait(client.submit(f"script:{key} we work on the migration now",
                                    persona_id=persona["id"])["id"])
    assert (job["status"], job["response"]["content"]) == ("completed", "set"), job
    first, second = llm.requests(key)
    assert "[Active project]" not in first["messages"][0]["content"]
    assert "[Active project]\nTOOL-PROJECT the migration" in second["messages"][0]["content"]
    shown = client.get(f"/v1/conversations/{job['conversation_id']}").json()
    assert shown["active_project"] == "TOOL-PROJECT the migration"
    llm.assert_done(key)


def test_a_tenants_default_layers_under_its_personas_own(stack, llm):
    # a tenant's admin sets default layers; a job with no persona gets them, a persona's
    # bootstrap replaces the tenant's, its skills follow the tenant's (a skill of the same
    # name replacing the tenant's), in seed 002's order in the model's request
    tenant = stack.create_tenant(uid("layers-d"))
    client = Client(stack, stack.create_key("layers-d", admin=True, tenant=tenant))
    path = client.url(f"/v1/admin/tenants/{tenant}/context_layers")
    assert client.get(f"/v1/admin/tenants/{tenant}/context_layers").json() == {
        "tenant_id": tenant, "bootstrap": None, "skills": None}
    set_ = client.http.patch(path, timeout=70, json={
        "bootstrap": "TENANT-BOOT the company ships on Mondays.",
        "skills": [{"name": "house style", "instructions": "TENANT-STYLE answer briefly."},
                   {"name": "arithmetic", "instructions": "TENANT-ARITH never shown here.",
                    "tools": ["math.evaluate"]}]})
    assert set_.status_code == 200, set_.text
    shown = client.get(f"/v1/admin/tenants/{tenant}/context_layers").json()
    assert shown == set_.json()
    assert shown["bootstrap"] == "TENANT-BOOT the company ships on Mondays."
    assert [(s["name"], s["tools"]) for s in shown["skills"]] == [
        ("house style", []), ("arithmetic", ["math.evaluate"])]

    key = uid("tenant-layers").replace("-", "_")
    llm.script(key, [text("without a persona"), text("with the persona")])
    bare = client.wait(client.submit(f"script:{key} first")["id"])
    assert bare["response"]["content"] == "without a persona", bare
    persona = client.post("/v1/personas", json={
        "name": "Own", "system_prompt": "SYSTEM-MARK you help.",
        "bootstrap": "PERSONA-BOOT this team ships on Fridays.",
        "allowed_modules": ["math"],
        "skills": [{"name": "arithmetic", "instructions": "PERSONA-ARITH check sums twice.",
                    "tools": ["math.evaluate"]},
                   {"name": "tone", "instructions": "PERSONA-TONE be warm."}]}).json()
    own = client.wait(client.submit(f"script:{key} second", persona_id=persona["id"])["id"])
    assert own["response"]["content"] == "with the persona", own
    first, second = (r["messages"][0]["content"] for r in llm.requests(key))
    llm.assert_done(key)

    # no persona: the tenant's bootstrap and skills (a skill with tools offered)
    assert "TENANT-BOOT" in first and "TENANT-STYLE" in first
    assert first.find("TENANT-BOOT") < first.find("[Skills]") < first.find("TENANT-STYLE")
    # the persona's: its bootstrap instead of the tenant's; the tenant's skills it does not
    # name, then its own
    assert "TENANT-BOOT" not in second and "TENANT-ARITH" not in second, second
    marks = ["SYSTEM-MARK", "PERSONA-BOOT", "[Skills]", "TENANT-STYLE", "PERSONA-ARITH",
             "PERSONA-TONE"]
    positions = [second.find(m) for m in marks]
    assert -1 not in positions and positions == sorted(positions), second

    # a persona with no bootstrap of its own gets the tenant's
    client.http.patch(client.url(f"/v1/personas/{persona['id']}"), json={"bootstrap": None},
                      timeout=70).raise_for_status()
    llm.script(key, [text("third")])
    client.wait(client.submit(f"script:{key} third", persona_id=persona["id"])["id"])
    third = llm.requests(key)[-1]["messages"][0]["content"]
    assert third.find("SYSTEM-MARK") < third.find("TENANT-BOOT") < third.find("[Skills]")
    llm.assert_done(key)

    # cleared field by field; what a PATCH may not hold
    cleared = client.http.patch(path, json={"bootstrap": None}, timeout=70)
    assert cleared.status_code == 200 and cleared.json()["bootstrap"] is None
    assert [s["name"] for s in cleared.json()["skills"]] == ["house style", "arithmetic"]
    for body in ({}, {"bootstrap": 3}, {"skills": [{"name": "x"}]},
                 {"skills": [{"name": "a", "instructions": "one"},
                             {"name": "a", "instructions": "two"}]},
                 {"bootstrap": "x", "quotas": {}}):
        refused = client.http.patch(path, json=body, timeout=70)
        assert refused.status_code == 422, (body, refused.text)
        assert refused.json()["error"]["code"] == "validation_error"
    assert client.get(f"/v1/admin/tenants/{tenant}/context_layers").json() == cleared.json()
