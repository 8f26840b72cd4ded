"""Branching (API.md 1.2): POST /v1/conversations/<id>/branch continues a conversation from
an earlier point with new content, in a new conversation; the source is not touched."""
from __future__ import annotations

import uuid

import pytest

from agentq.testing.scripted_llm import text
from tests.support.api import Client, uid

pytestmark = pytest.mark.integration


def said(request: dict) -> list[tuple[str, str]]:
    """A model request's conversation: (role, text) of its user and assistant messages."""
    out = []
    for m in request["messages"]:
        if m.get("role") in ("user", "assistant"):
            content = m.get("content")
            if isinstance(content, list):
                content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            out.append((m["role"], content or ""))
    return out


def test_a_branch_carries_the_history_before_its_point_and_the_new_content(
        client, llm, stack):
    key = uid("branch").replace("-", "_")
    llm.script(key, [text("Paris."), text("About 2.1 million."), text("Lyon."),
                     text("Marseille.")])
    first = client.wait(client.submit(f"script:{key} the capital of France?")["id"])
    conversation = first["conversation_id"]
    second = client.post("/v1/continue", json={"conversation_id": conversation,
                                               "content": "how many live there?"})
    assert second.status_code == 202, second.text
    second = client.wait(second.json()["id"])
    assert second["response"]["content"] == "About 2.1 million."
    source = client.get(f"/v1/conversations/{conversation}/messages").json()["data"]
    assert [m["role"] for m in source] == ["user", "assistant", "user", "assistant"]

    # branching before the second job: the first exchange, then the new question
    made = client.post(f"/v1/conversations/{conversation}/branch",
                       json={"at_job_id": second["id"], "content": "and its second city?"})
    assert made.status_code == 202, made.text
    assert made.headers["Location"] == f"/v1/jobs/{made.json()['id']}"
    branch = client.wait(made.json()["id"])
    assert branch["status"] == "completed" and branch["response"]["content"] == "Lyon."
    assert branch["conversation_id"] != conversation
    request = llm.requests(key)[2]
    assert said(request) == [("user", f"script:{key} the capital of France?"),
                             ("assistant", "Paris."), ("user", "and its second city?")]
    turn = [e for e in client.events(branch["id"]) if e["type"] == "turn_start"][0]
    assert turn["data"]["triggered_by"] == "branch"
    shown = client.get(f"/v1/conversations/{branch['conversation_id']}")
    assert shown.status_code == 200, shown.text
    assert shown.json()["branched_from"] == {"conversation_id": conversation,
                                             "message_id": source[2]["id"]}
    assert shown.json()["id"] == branch["conversation_id"] and shown.json()["created_at"]
    plain = client.get(f"/v1/conversations/{conversation}").json()
    assert plain["branched_from"] is None and plain["id"] == conversation
    assert [m["role"] for m in client.get(f"/v1/conversations/{branch['conversation_id']}"
                                          "/messages").json()["data"]] == [
        "user", "assistant", "user", "assistant"]
    # the source is untouched
    assert client.get(f"/v1/conversations/{conversation}/messages").json()["data"] == source

    # before a message: only what came before it; a later turn of the branch is the user's
    made = client.post(f"/v1/conversations/{conversation}/branch",
                       json={"at_message_id": source[1]["id"], "content": "or Marseille?"})
    assert made.status_code == 202, made.text
    again = client.wait(made.json()["id"])
    assert again["response"]["content"] == "Marseille."
    assert said(llm.requests(key)[3]) == [("user", f"script:{key} the capital of France?"),
                                          ("user", "or Marseille?")]
    llm.assert_done(key)


def test_branching_is_checked_and_kept_to_its_owner(client, llm, stack):
    key = uid("branchk").replace("-", "_")
    llm.script(key, [text("one"), text("mine"), text("branched")])
    job = client.wait(client.submit(f"script:{key} hello")["id"])
    conversation = job["conversation_id"]
    path = f"/v1/conversations/{conversation}/branch"
    messages = client.get(f"/v1/conversations/{conversation}/messages").json()["data"]

    for body in ({"content": "x"},  # no point
                 {"at_job_id": job["id"], "at_message_id": messages[0]["id"], "content": "x"},
                 {"at_job_id": job["id"], "content": " "},
                 {"at_job_id": job["id"]},
                 {"at_job_id": "nope", "content": "x"},
                 {"at_job_id": job["id"], "content": "x", "surprise": 1}):
        refused = client.post(path, json=body)
        assert refused.status_code == 422, (body, refused.text)
        assert refused.json()["error"]["code"] == "validation_error"
    assert client.post(path, data="x", headers={"Content-Type": "text/plain"}
                       ).status_code == 415
    # a point that is not this conversation's, a conversation that is not there
    for body in ({"at_job_id": str(uuid.uuid4()), "content": "x"},
                 {"at_message_id": str(uuid.uuid4()), "content": "x"},
                 {"at_job_id": job["id"], "content": "x", "persona_id": str(uuid.uuid4())}):
        assert client.post(path, json=body).status_code == 404, body
    assert client.post(f"/v1/conversations/{uuid.uuid4()}/branch",
                       json={"at_job_id": job["id"], "content": "x"}).status_code == 404
    assert client.get(f"/v1/conversations/{uuid.uuid4()}").status_code == 404
    assert client.get("/v1/conversations/nope").status_code == 404

    # another tenant's key, and a non-admin key of this tenant, see no such conversation
    stranger = Client(stack, stack.create_key("br-other", admin=True,
                                              tenant=stack.create_tenant(uid("br-t"))))
    plain = Client(stack, stack.create_key("br-plain", admin=False))
    for outsider in (stranger, plain):
        assert outsider.get(f"/v1/conversations/{conversation}").status_code == 404
        refused = outsider.post(path, json={"at_job_id": job["id"], "content": "x"})
        assert refused.status_code == 404 and refused.json()["error"]["code"] == "not_found"

    # a non-admin key branches its own conversation: the branch is its own too
    own = plain.wait(plain.submit(f"script:{key} mine")["id"])
    assert own["response"]["content"] == "mine"
    refused = plain.post(f"/v1/conversations/{own['conversation_id']}/branch",
                         json={"at_job_id": own["id"], "content": "x",
                               "model": "any-model-at-all"})
    assert refused.status_code == 422 and "model" in refused.json()["error"]["details"]["fields"]
    made = plain.post(f"/v1/conversations/{own['conversation_id']}/branch",
                      json={"at_job_id": own["id"], "content": f"script:{key} again"})
    assert made.status_code == 202, made.text
    branch = plain.wait(made.json()["id"])
    assert branch["response"]["content"] == "branched"
    assert plain.get(f"/v1/conversations/{branch['conversation_id']}").status_code == 200
    other_plain = Client(stack, stack.create_key("br-plain2", admin=False))
    assert other_plain.get(f"/v1/conversations/{branch['conversation_id']}"
                           ).status_code == 404
    llm.assert_done(key)
