"""agentq.tools.safe_math: correct arithmetic, and every forbidden construct refused."""
from __future__ import annotations

import math
import time

import pytest

from agentq.errors import ToolError
from agentq.tools.safe_math import MAX_EXPRESSION_CHARS, MathError, evaluate


@pytest.mark.parametrize("expression, expected", [
    ("1 + 2", 3),
    ("2 + 3 * 4", 14),
    ("(2 + 3) * 4", 20),
    ("10 - 4 - 3", 3),
    ("2 ** 3 ** 2", 512),           # ** is right-associative
    ("-2 ** 2", -4),                # unary minus binds looser than **
    ("(-2) ** 2", 4),
    ("--3", 3),
    ("+-+3", -3),
    ("7 / 2", 3.5),
    ("7 // 2", 3),
    ("-7 // 2", -4),
    ("7 % 3", 1),
    ("2 ** -1", 0.5),
    ("2 ** 0.5", math.sqrt(2)),
    ("1_000 * 3", 3000),
    ("0x10 + 1", 17),
    ("1.5e3", 1500.0),
    ("2 ** 100", 2 ** 100),          # exact big integers
    ("sqrt(16)", 4.0),
    ("abs(-3)", 3),
    ("round(2.567, 2)", 2.57),
    ("round(2.5)", 2),
    ("min(3, 1, 2)", 1),
    ("max(3, 1.5)", 3),
    ("floor(2.7) + ceil(2.2)", 5),
    ("factorial(10)", 3628800),
    ("log(e)", 1.0),
    ("log(8, 2)", 3.0),
    ("log10(1000)", 3.0),
    ("log2(1024)", 10.0),
    ("exp(0)", 1.0),
    ("sin(0) + cos(0)", 1.0),
    ("tan(pi / 4)", pytest.approx(1.0)),
    ("asin(1) * 2", pytest.approx(math.pi)),
    ("acos(1) + atan(0)", 0.0),
    ("tau / 2", math.pi),
    ("2 * (3 + sqrt(16)) / 7", 2.0),
    ("  1 + 1  ", 2),
])
def test_computes(expression, expected):
    assert evaluate(expression) == expected


@pytest.mark.parametrize("expression, kind", [
    ("6 * 7", int), ("6 / 3", float), ("2 ** 10", int), ("2 ** -1", float),
    ("floor(2.5)", int), ("sqrt(4)", float), ("factorial(5)", int), ("1 + 1.0", float),
])
def test_int_only_for_exact_integer_arithmetic(expression, kind):
    assert type(evaluate(expression)) is kind


@pytest.mark.parametrize("expression, message", [
    ("x + 1", "name 'x' is not allowed"),
    ("__import__('os')", "function '__import__' is not allowed"),
    ("().__class__", "attribute access is not allowed"),
    ("(1).real", "attribute access is not allowed"),
    ("math.pi", "attribute access is not allowed"),
    ("[1, 2][0]", "not allowed"),
    ("abs[0]", "subscripting is not allowed"),
    ("lambda: 1", "lambda is not allowed"),
    ("[i for i in (1, 2)]", "comprehension is not allowed"),
    ("sum(i for i in (1, 2))", "function 'sum' is not allowed"),
    ("'a' * 3", "a string is not allowed"),
    ("b'a'", "bytes is not allowed"),
    ("True + 1", "True is not allowed"),
    ("None", "None is not allowed"),
    ("1j * 2", "a complex number is not allowed"),
    ("1 if 1 else 2", "'if'/'else' is not allowed"),
    ("1 < 2", "comparison is not allowed"),
    ("1 and 2", "'and'/'or' is not allowed"),
    ("not 1", "operator 'not' is not allowed"),
    ("~1", "operator '~' is not allowed"),
    ("2 ^ 3", "use ** for powers"),
    ("1 << 100", "operator '<<' is not allowed"),
    ("(x := 1)", "assignment (:=) is not allowed"),
    ("f'{1}'", "f-string is not allowed"),
    ("sqrt", "must be called"),
    ("pi(1)", "is a constant, not a function"),
    ("sqrt(x=4)", "keyword arguments are not allowed"),
    ("sqrt(*(4,))", "not allowed"),
    ("sqrt(1, 2)", "takes 1 argument"),
    ("log()", "takes 1 to 2 argument"),
    ("min()", "takes at least 1 argument"),
    ("1 +", "not valid syntax"),
    ("import os", "not valid syntax"),
    ("1; 2", "not valid syntax"),
    ("", "empty"),
    ("   ", "empty"),
])
def test_rejects_forbidden_constructs(expression, message):
    with pytest.raises(MathError) as info:
        evaluate(expression)
    assert message in str(info.value)


@pytest.mark.parametrize("expression, message", [
    ("1 / 0", "division by zero"),
    ("1 // 0", "division by zero"),
    ("5 % 0", "division by zero"),
    ("1.0 / 0.0", "division by zero"),
    ("0 ** -1", "division by zero"),
    ("log(2, 1)", "division by zero"),
    ("sqrt(-1)", "sqrt(): invalid argument"),
    ("log(0)", "log(): invalid argument"),
    ("asin(2)", "asin(): invalid argument"),
    ("(-8) ** (1 / 3)", "complex"),
    ("1e308 * 10", "too large"),
    ("1e309", "too large"),
    ("exp(1000)", "too large"),
    ("10.0 ** 400", "too large"),
    ("factorial(-1)", "non-negative integer"),
    ("factorial(2.5)", "non-negative integer"),
    ("round(1.5, 0.5)", "must be an integer"),
])
def test_rejects_impossible_arithmetic(expression, message):
    with pytest.raises(MathError, match=message.replace("(", r"\(").replace(")", r"\)")):
        evaluate(expression)


@pytest.mark.parametrize("expression, message", [
    ("9 ** 9 ** 9", "exponent 387420489 is too large"),
    ("10 ** 100000", "more than 4000 digits"),
    ("2 ** 1000000", "exponent 1000000 is too large"),
    ("(10 ** 3000) * (10 ** 3000)", "more than 4000 digits"),
    ("factorial(100000)", "factorial(100000) is too large"),
    ("factorial(1001)", "too large"),
    ("factorial(1000) * factorial(1000)", "more than 4000 digits"),
    ("round(5, -100000)", "number of digits"),
    ("sqrt(10 ** 3999 * 10)", "more than 4000 digits"),
    ("1.0000001 ** 10000000", "too large"),
])
def test_refuses_denial_of_service_quickly(expression, message):
    # CPU time of this thread, not the wall clock: computing any of these would take many
    # CPU-seconds, refusing it takes microseconds, and a loaded machine changes neither
    started = time.thread_time()
    with pytest.raises(MathError, match=message.replace("(", r"\(").replace(")", r"\)")):
        evaluate(expression)
    assert time.thread_time() - started < 0.5


def test_large_but_allowed_results_are_exact():
    assert evaluate("2 ** 10000") == 2 ** 10000
    assert evaluate("factorial(1000)") == math.factorial(1000)


@pytest.mark.parametrize("expression", [
    "abs(" * 60 + "1" + ")" * 60,        # nested calls
    "-" * 200 + "1",                     # nested unary operators
    "(" * 300 + "1" + ")" * 300,         # too many parentheses for the parser
])
def test_rejects_deep_nesting(expression):
    with pytest.raises(MathError, match="nested|not valid syntax"):
        evaluate(expression)


def test_rejects_too_long_input():
    expression = "1+" * (MAX_EXPRESSION_CHARS // 2) + "1"
    with pytest.raises(MathError, match=f"the limit is {MAX_EXPRESSION_CHARS}"):
        evaluate(expression)


def test_rejects_non_string():
    with pytest.raises(MathError, match="must be a string"):
        evaluate(42)  # type: ignore[arg-type]


def test_math_error_is_a_non_retryable_tool_error():
    with pytest.raises(ToolError) as info:
        evaluate("1 / 0")
    assert info.value.code == "math_error"
    assert info.value.retryable is False
    assert info.value.message == "division by zero"
