"""agentq.loop.layers: a persona's layers over its tenant's defaults (issue 36), rendered as
the system message's blocks. The order they take in the model's request is shown through
the real stack in tests/integration/test_context_layers.py."""
from __future__ import annotations

from types import SimpleNamespace

from agentq.llm.types import ToolSpec
from agentq.loop.layers import TenantLayers, extras, merged_skills

TOOLS = [ToolSpec(name="math.evaluate", description="Evaluate.",
                  parameters={"type": "object", "properties": {}})]
CONVERSATION = SimpleNamespace(active_project=None)


def persona(bootstrap=None, skills=None):
    return SimpleNamespace(bootstrap=bootstrap, skills=skills, tool_docs=False)


def skill(name: str, text: str, tools=()) -> dict:
    return {"name": name, "instructions": text, "tools": list(tools)}


def test_a_persona_bootstrap_replaces_the_tenants_and_none_leaves_it():
    tenant = TenantLayers("TENANT-BOOT", None)
    assert extras(persona("OWN-BOOT"), CONVERSATION, TOOLS, tenant)["bootstrap"] == \
        "[Bootstrap]\nOWN-BOOT"
    for own in (None, "", "   "):
        assert extras(persona(own), CONVERSATION, TOOLS, tenant)["bootstrap"] == \
            "[Bootstrap]\nTENANT-BOOT"
    assert extras(None, CONVERSATION, TOOLS, tenant)["bootstrap"] == "[Bootstrap]\nTENANT-BOOT"
    assert extras(persona(), CONVERSATION, TOOLS, TenantLayers(None, None))["bootstrap"] is None
    assert extras(persona(), CONVERSATION, TOOLS)["bootstrap"] is None


def test_the_tenants_skills_come_first_less_those_the_persona_names_again():
    tenant = [skill("style", "T-STYLE"), skill("math", "T-MATH", ["math.evaluate"]),
              skill("web", "T-WEB", ["web.fetch"])]
    own = [skill("math", "P-MATH", ["math.evaluate"]), skill("tone", "P-TONE")]
    assert [s["instructions"] for s in merged_skills(tenant, own)] == [
        "T-STYLE", "T-WEB", "P-MATH", "P-TONE"]
    assert merged_skills(tenant, None) == tenant and merged_skills(None, own) == own
    assert merged_skills(None, None) == []

    text = extras(persona(skills=own), CONVERSATION, TOOLS,
                  TenantLayers(None, tenant))["skills"]
    # T-WEB's tool is not offered: left out, as a persona's skill would be
    assert "T-WEB" not in text and "T-MATH" not in text
    assert text.index("T-STYLE") < text.index("P-MATH") < text.index("P-TONE")
    assert text.startswith("[Skills]\n## style\n")
