"""agentq's test kit: test your own personas, tools and hooks against the real loop.

- `agentq.testing.harness`: a whole job in one process (the real Stepper, tools and
  database; a scripted model; effects run in order by the in-process runner). `Harness`,
  `ScriptedModel`, `text`, `calls`.
- `agentq.testing.scripted_llm`: a scripted OpenAI-compatible server (`ScriptedLLM`) for a
  stack of real processes, whose workers reach it through the `openai` SDK.

docs/testing.md shows them at work; agentq's own tests and benchmarks are built on them.
"""
from agentq.testing.harness import MODEL, Harness, ScriptedModel, UnexpectedModelCall, calls, text

__all__ = ["MODEL", "Harness", "ScriptedModel", "UnexpectedModelCall", "calls", "text"]
