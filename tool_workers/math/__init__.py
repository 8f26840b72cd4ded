"""Tool module `math`: exact and floating-point arithmetic by a safe parser (no eval)."""
from __future__ import annotations

from typing import Any

from agentq.tools.manifest import ToolContext, define_module
from agentq.tools.safe_math import MAX_EXPRESSION_CHARS, MathError
from agentq.tools.safe_math import evaluate as safe_evaluate

TIME_LIMIT_S = 5


def evaluate(args: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """Compute one expression; a MathError names what is wrong with it."""
    expression = args.get("expression")
    if not isinstance(expression, str):
        raise MathError("'expression' must be a string")
    return {"expression": expression, "result": safe_evaluate(expression)}


MODULE = define_module({
    "module": "math",
    "description": "Arithmetic: evaluate a numeric expression exactly where possible.",
    "local": True,  # pure and bounded: may run in the step (AGENTQ_LOCAL_MODULES)
    "tools": [
        {
            "name": "math.evaluate",
            "description": (
                "Evaluate an arithmetic expression and return its value. Supports numbers, "
                "+ - * / // % ** and parentheses, the constants pi, e and tau, and the "
                "functions sqrt, sin, cos, tan, asin, acos, atan, log(x[, base]), log10, "
                "log2, exp, abs, round(x[, ndigits]), min, max, floor, ceil and factorial. "
                "Integer arithmetic is exact. Angles are in radians. No variables."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "expression": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": MAX_EXPRESSION_CHARS,
                        "description": "The expression, e.g. \"2 * (3 + sqrt(16)) / 7\".",
                    },
                },
                "required": ["expression"],
                "additionalProperties": False,
            },
            "permission": "guest",
            "function": evaluate,
            "idempotent": True,
            "time_limit_s": TIME_LIMIT_S,
        },
    ],
})
