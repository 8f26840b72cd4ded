"""The admin subcommands (`agentq personas|users|keys|usage`) as an operator runs them,
against the stack's database; what they do is seen through the HTTP API."""
from __future__ import annotations

import json

import pytest

from agentq.testing.scripted_llm import text
from tests.support.api import Client, uid

pytestmark = pytest.mark.integration


def lines(result) -> list[dict]:
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def tenant(stack):
    name = uid("cli-t")
    tenant_id = stack.create_tenant(name)
    return {"name": name, "id": tenant_id,
            "client": Client(stack, stack.create_key("cli-adm", admin=True, tenant=tenant_id))}


def test_personas_create_list_show_update_delete(stack, tenant):
    t = tenant["name"]
    first = lines(stack.agentq("personas", "create", "Helper", "--tenant", t,
                               "--system-prompt", "Be brief.", "--modules", "math,time"))[0]
    assert first["is_default"] and first["allowed_modules"] == ["math", "time"]
    second = lines(stack.agentq("personas", "create", "Other", "--tenant", t, "--default"))[0]
    listed = lines(stack.agentq("personas", "list", "--tenant", t))
    assert [(p["id"], p["is_default"]) for p in listed] == [(first["id"], False),
                                                            (second["id"], True)]
    shown = lines(stack.agentq("personas", "show", first["id"], "--tenant", t))[0]
    assert shown["system_prompt"] == "Be brief."
    updated = lines(stack.agentq("personas", "update", first["id"], "--tenant", t,
                                 "--name", "Helper 2", "--model", "primary-model"))[0]
    assert (updated["name"], updated["default_model"]) == ("Helper 2", "primary-model")
    # the API sees what the CLI made
    via_api = tenant["client"].get(f"/v1/personas/{first['id']}").json()
    assert via_api["name"] == "Helper 2"

    deleted = lines(stack.agentq("personas", "delete", second["id"], "--tenant", t))[0]
    assert deleted == {"id": second["id"], "deleted": True}
    assert [p["is_default"] for p in lines(stack.agentq("personas", "list", "--tenant", t))
            ] == [True]


def test_persona_options_match_the_api_fields(stack, tenant):
    """--requires-approval, --stream and the limits, as POST|PATCH /v1/personas take them."""
    t = tenant["name"]
    made = lines(stack.agentq("personas", "create", "Guarded", "--tenant", t, "--not-default",
                              "--requires-approval", "flaky.echo, flaky.guarded", "--stream",
                              "--max-iterations", "4", "--max-job-tokens", "9000"))[0]
    assert made["requires_approval"] == ["flaky.echo", "flaky.guarded"]
    assert made["stream"] is True
    assert made["limits"] == {"max_iterations": 4, "max_tokens": 9000}
    updated = lines(stack.agentq("personas", "update", made["id"], "--tenant", t,
                                 "--max-seconds", "30", "--no-stream",
                                 "--requires-approval", "none"))[0]
    assert updated["limits"] == {"max_iterations": 4, "max_tokens": 9000, "max_seconds": 30}
    assert updated["stream"] is False and updated["requires_approval"] is None
    via_api = tenant["client"].get(f"/v1/personas/{made['id']}").json()
    assert via_api["limits"] == updated["limits"] and via_api["requires_approval"] is None


@pytest.mark.parametrize("args,said", [
    (("users", "set", "api", "someone", "--budget", "abc"), "'abc' is not a whole number"),
    (("users", "set", "api", "someone", "--budget", "-5"), "-5 is not in the range"),
    (("users", "set", "api", "someone", "--budget", "1.5"), "is not a whole number"),
    (("users", "set", "api", "someone", "--level", "god"), "'god' is not one of"),
    (("personas", "create", "X", "--max-iterations", "0"), "--max-iterations"),
    (("personas", "create", "X", "--max-job-tokens", "-1"), "--max-job-tokens"),
    (("personas", "create", "X", "--max-seconds", "abc"), "--max-seconds"),
])
def test_bad_option_values_are_one_usage_error_exit_2(stack, args, said):
    result = stack.agentq(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert said in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, result.stderr


def test_a_users_budget_set_by_the_cli_is_what_the_api_shows(stack, tenant):
    t, client = tenant["name"], tenant["client"]
    ref = uid("u")
    for budget, shown in (("5000", 5000), ("unlimited", None), ("0", 0)):
        set_ = lines(stack.agentq("users", "set", "api", ref, "--budget", budget,
                                  "--tenant", t))[0]
        assert set_["token_budget_monthly"] == shown
        assert client.get(f"/v1/users/{set_['user_id']}").json()[
            "token_budget_monthly"] == shown


@pytest.mark.parametrize("args,said", [
    (("personas", "create", "X", "--modules", "nope"), "Unknown tool module"),
    (("personas", "show", "not-an-id"), "No persona"),
    (("personas", "delete", "00000000-0000-0000-0000-000000000000"), "No persona"),
    (("personas", "list", "--tenant", "no-such-tenant"), "No tenant"),
    (("users", "show", "api:nobody-at-all"), "No user"),
    (("keys", "rotate", "00000000-0000-0000-0000-000000000000"), "No key"),
    (("keys", "revoke", "00000000-0000-0000-0000-000000000000"), "No key"),
    (("usage", "--by", "planet"), "planet"),
    (("personas", "create", "X", "--requires-approval", "no.such_tool"), "Unknown tool"),
])
def test_bad_input_is_a_message_and_exit_status_not_a_traceback(stack, args, said):
    result = stack.agentq(*args)
    assert result.returncode != 0
    assert said in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_users_list_show_set_link_and_usage(stack, tenant, script):
    t, client = tenant["name"], tenant["client"]
    ref = uid("u")
    marker = script([text("hi", input_tokens=30, output_tokens=4)])
    client.wait(client.submit(f"{marker} hello", user=ref)["id"])

    users = lines(stack.agentq("users", "list", "--tenant", t))
    mine = [u for u in users if any(i["platform_user_id"] == ref for i in u["identities"])]
    assert len(mine) == 1
    shown = json.loads(stack.agentq("users", "show", f"api:{ref}", "--tenant", t).stdout)
    assert shown["usage"]["input_tokens"] == 30 and len(shown["token_logs"]) == 1

    set_ = lines(stack.agentq("users", "set", "api", ref, "--level", "user", "--budget",
                              "777", "--tenant", t))[0]
    assert (set_["permission_level"], set_["token_budget_monthly"]) == ("user", 777)
    linked = lines(stack.agentq("users", "link", shown["id"], "slack", "S-" + ref,
                                "--tenant", t))[0]
    assert {i["platform"] for i in linked["identities"]} == {"api", "slack"}
    other = uid("u")
    marker = script([text("hey")])
    client.wait(client.submit(f"{marker} hello", user=other)["id"])
    clash = stack.agentq("users", "link", shown["id"], "api", other, "--tenant", t)
    assert clash.returncode != 0 and "linked to another user" in clash.stderr

    rows = lines(stack.agentq("usage", "--by", "user", "--tenant", t))
    assert {"key": shown["id"], "input_tokens": 30, "output_tokens": 4, "total_tokens": 34,
            "calls": 1} == {k: v for k, v in next(r for r in rows if r["key"] == shown["id"])
                            .items() if k != "cost_estimate"}


def test_keys_list_rotate_revoke(stack, tenant):
    key = stack.create_key("cli-rot", admin=False, tenant=tenant["id"])
    listed = lines(stack.agentq("keys", "list"))
    row = next(k for k in listed if k["prefix"] == key[:10])
    new_key = stack.agentq("keys", "rotate", row["id"])
    assert new_key.returncode == 0, new_key.stderr
    new_key = new_key.stdout.strip()
    assert new_key.startswith("aq_") and new_key != key
    assert Client(stack, key).get("/v1/schedules").status_code == 401
    assert Client(stack, new_key).get("/v1/schedules").status_code == 200
    again = stack.agentq("keys", "rotate", row["id"])
    assert again.returncode != 0 and "revoked" in again.stderr
    new_row = next(k for k in lines(stack.agentq("keys", "list"))
                   if k["prefix"] == new_key[:10])
    revoked = lines(stack.agentq("keys", "revoke", new_row["id"]))[0]
    assert revoked["revoked_at"]
    assert Client(stack, new_key).get("/v1/schedules").status_code == 401
