"""Arithmetic on untrusted input without eval: a small interpreter over Python's AST.

`evaluate("2 * (3 + sqrt(16))")` parses with `ast.parse(mode="eval")` and walks the tree,
allowing only numbers, + - * / // % **, unary + and -, parentheses, an allowlist of
functions and the constants pi, e and tau. Nothing is ever compiled or executed.

Denial of service is refused before the work is done: the input length, the nesting depth,
the exponent of `**`, the size of integer results (estimated with logarithms before a
multiplication or a power is computed) and the argument of factorial are all capped.

Every failure raises `MathError` with a message naming the problem.
"""
from __future__ import annotations

import ast
import logging
import math
from typing import Callable, Union

from agentq.errors import ToolError

log = logging.getLogger(__name__)

Number = Union[int, float]

MAX_EXPRESSION_CHARS = 1000
MAX_DEPTH = 50
"""Nesting of the syntax tree: operators, calls and parentheses inside each other."""
MAX_EXPONENT = 100_000
"""Largest magnitude of the right operand of `**`."""
MAX_RESULT_DIGITS = 4000
"""Largest integer (in decimal digits), for the result and every intermediate value. Kept
below CPython's int-to-str limit (4300 digits) so a result can always be written as JSON."""
MAX_FACTORIAL_ARG = 1000
MAX_ROUND_NDIGITS = 1000

_LOG10_2 = math.log10(2)

CONSTANTS: dict[str, float] = {"pi": math.pi, "e": math.e, "tau": math.tau}

_OPERATOR_SYMBOLS = {
    ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//",
    ast.Mod: "%", ast.Pow: "**", ast.LShift: "<<", ast.RShift: ">>", ast.BitOr: "|",
    ast.BitXor: "^", ast.BitAnd: "&", ast.MatMult: "@",
}

_NODE_NAMES = {
    ast.Attribute: "attribute access", ast.Subscript: "subscripting", ast.Lambda: "lambda",
    ast.ListComp: "a comprehension", ast.SetComp: "a comprehension",
    ast.DictComp: "a comprehension", ast.GeneratorExp: "a generator expression",
    ast.Compare: "comparison", ast.BoolOp: "'and'/'or'", ast.IfExp: "'if'/'else'",
    ast.List: "a list", ast.Tuple: "a tuple", ast.Set: "a set", ast.Dict: "a dict",
    ast.JoinedStr: "an f-string", ast.NamedExpr: "assignment (:=)", ast.Starred: "unpacking",
    ast.Await: "await", ast.Yield: "yield", ast.YieldFrom: "yield",
    ast.Slice: "a slice", ast.FormattedValue: "an f-string",
}


class MathError(ToolError):
    """The expression is not allowed or cannot be computed; retrying will not help."""
    code = "math_error"
    retryable = False


def evaluate(expression: str) -> Number:
    """Compute `expression`; an int when the arithmetic was exact integer arithmetic."""
    if not isinstance(expression, str):
        raise MathError(f"the expression must be a string, not {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise MathError(f"the expression is {len(expression)} characters long; the limit "
                        f"is {MAX_EXPRESSION_CHARS}")
    if not expression.strip():
        raise MathError("the expression is empty")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise MathError(f"the expression is not valid syntax: {exc.msg}") from None
    except (ValueError, RecursionError, MemoryError) as exc:
        raise MathError(f"the expression cannot be parsed: {exc}") from None
    try:
        result = _Evaluator().visit(tree.body, 0)
    except MathError as exc:
        log.debug("math rejected", extra={"problem": exc.message,
                                          "expression_chars": len(expression)})
        raise
    return _checked(result)


class _Evaluator:
    def visit(self, node: ast.AST, depth: int) -> Number:
        if depth > MAX_DEPTH:
            raise MathError(f"the expression is nested more than {MAX_DEPTH} levels deep")
        if isinstance(node, ast.Constant):
            return _constant(node.value)
        if isinstance(node, ast.Name):
            if node.id in CONSTANTS:
                return CONSTANTS[node.id]
            if node.id in FUNCTIONS:
                raise MathError(f"function '{node.id}' must be called, e.g. {node.id}(x)")
            raise MathError(f"name '{node.id}' is not allowed; known constants: "
                            f"{', '.join(sorted(CONSTANTS))}")
        if isinstance(node, ast.UnaryOp):
            if isinstance(node.op, ast.USub):
                return _checked(-self.visit(node.operand, depth + 1))
            if isinstance(node.op, ast.UAdd):
                return _checked(+self.visit(node.operand, depth + 1))
            symbol = {ast.Not: "not", ast.Invert: "~"}.get(type(node.op), "?")
            raise MathError(f"operator '{symbol}' is not allowed")
        if isinstance(node, ast.BinOp):
            handler = _BINARY.get(type(node.op))
            if handler is None:
                symbol = _OPERATOR_SYMBOLS.get(type(node.op), type(node.op).__name__)
                hint = " (use ** for powers)" if symbol == "^" else ""
                raise MathError(f"operator '{symbol}' is not allowed{hint}")
            left = self.visit(node.left, depth + 1)
            right = self.visit(node.right, depth + 1)
            return _checked(handler(left, right))
        if isinstance(node, ast.Call):
            return self._call(node, depth)
        what = _NODE_NAMES.get(type(node), type(node).__name__)
        raise MathError(f"{what} is not allowed in an arithmetic expression")

    def _call(self, node: ast.Call, depth: int) -> Number:
        if not isinstance(node.func, ast.Name):
            raise MathError("only calls of the allowed functions by name are allowed, "
                            "e.g. sqrt(2)")
        name = node.func.id
        if name in CONSTANTS:
            raise MathError(f"'{name}' is a constant, not a function")
        spec = FUNCTIONS.get(name)
        if spec is None:
            raise MathError(f"function '{name}' is not allowed; allowed: "
                            f"{', '.join(sorted(FUNCTIONS))}")
        if node.keywords:
            raise MathError(f"{name}(): keyword arguments are not allowed")
        fn, min_args, max_args = spec
        if not min_args <= len(node.args) <= (max_args or len(node.args)):
            wanted = (f"{min_args}" if min_args == max_args else
                      f"{min_args} to {max_args}" if max_args else f"at least {min_args}")
            raise MathError(f"{name}() takes {wanted} argument(s), got {len(node.args)}")
        args = [self.visit(arg, depth + 1) for arg in node.args]
        try:
            return _checked(fn(*args))
        except MathError:
            raise
        except ZeroDivisionError:
            raise MathError(f"{name}(): division by zero") from None
        except OverflowError:
            raise MathError(f"{name}(): the number is too large") from None
        except (ValueError, TypeError) as exc:
            raise MathError(f"{name}(): invalid argument ({exc})") from None


# --- numbers --------------------------------------------------------------------------

def _constant(value: object) -> Number:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = {str: "a string", bytes: "bytes", complex: "a complex number"}.get(
            type(value), repr(value))
        raise MathError(f"{kind} is not allowed; only numbers are")
    return _checked(value)


def _checked(value: object) -> Number:
    """Every intermediate result passes here: finite real numbers of bounded size."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        if isinstance(value, complex):
            raise MathError("the result is a complex number (e.g. a fractional power of a "
                            "negative number)")
        raise MathError(f"unexpected value of type {type(value).__name__}")
    if isinstance(value, float):
        if math.isnan(value):
            raise MathError("the result is not a number (nan)")
        if math.isinf(value):
            raise MathError("the result is too large (overflow to infinity)")
    elif _digits(value) > MAX_RESULT_DIGITS:
        raise MathError(f"the result would have more than {MAX_RESULT_DIGITS} digits")
    return value


def _digits(value: int) -> float:
    """An upper estimate of the decimal digits of an int, without converting it."""
    return value.bit_length() * _LOG10_2 + 1


def _refuse_big(estimated_digits: float) -> None:
    if estimated_digits > MAX_RESULT_DIGITS:
        raise MathError(f"the result would have more than {MAX_RESULT_DIGITS} digits")


def _arith(op: Callable[[Number, Number], Number]) -> Callable[[Number, Number], Number]:
    def run(a: Number, b: Number) -> Number:
        try:
            return op(a, b)
        except ZeroDivisionError:
            raise MathError("division by zero") from None
        except OverflowError:
            raise MathError("the result is too large") from None
    return run


def _mul(a: Number, b: Number) -> Number:
    if isinstance(a, int) and isinstance(b, int) and a and b:
        _refuse_big(_digits(a) + _digits(b) - 2)
    return a * b


def _pow(base: Number, exponent: Number) -> Number:
    if abs(exponent) > MAX_EXPONENT:
        raise MathError(f"the exponent {exponent} is too large; the limit is "
                        f"{MAX_EXPONENT}")
    if base == 0 and exponent < 0:
        raise MathError("division by zero (zero to a negative power)")
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
        _refuse_big(exponent * math.log10(abs(base)))
    elif isinstance(base, float) or isinstance(exponent, float) or exponent < 0:
        if base and abs(exponent) * abs(math.log10(abs(base))) > 400:
            # Far beyond a float's range (1e308): too large, or indistinguishable from 0.
            if (abs(base) > 1) == (exponent > 0):
                raise MathError("the result is too large")
            return 0.0
    return base ** exponent


_BINARY: dict[type, Callable[[Number, Number], Number]] = {
    ast.Add: _arith(lambda a, b: a + b),
    ast.Sub: _arith(lambda a, b: a - b),
    ast.Mult: _arith(_mul),
    ast.Div: _arith(lambda a, b: a / b),
    ast.FloorDiv: _arith(lambda a, b: a // b),
    ast.Mod: _arith(lambda a, b: a % b),
    ast.Pow: _arith(_pow),
}


# --- functions ------------------------------------------------------------------------

def _factorial(n: Number) -> int:
    if isinstance(n, float) and n.is_integer():
        n = int(n)
    if not isinstance(n, int) or n < 0:
        raise MathError("factorial() needs a non-negative integer")
    if n > MAX_FACTORIAL_ARG:
        raise MathError(f"factorial({n}) is too large; the limit is "
                        f"factorial({MAX_FACTORIAL_ARG})")
    return math.factorial(n)


def _round(x: Number, ndigits: Number | None = None) -> Number:
    if ndigits is None:
        return round(x)
    if not isinstance(ndigits, int):
        raise MathError("round(): the number of digits must be an integer")
    if abs(ndigits) > MAX_ROUND_NDIGITS:
        raise MathError(f"round(): the number of digits must be within "
                        f"±{MAX_ROUND_NDIGITS}")
    return round(x, ndigits)


def _log(x: Number, base: Number | None = None) -> float:
    return math.log(x) if base is None else math.log(x, base)


# name -> (function, min args, max args or None for any number)
FUNCTIONS: dict[str, tuple[Callable[..., Number], int, int | None]] = {
    "sqrt": (math.sqrt, 1, 1), "exp": (math.exp, 1, 1),
    "sin": (math.sin, 1, 1), "cos": (math.cos, 1, 1), "tan": (math.tan, 1, 1),
    "asin": (math.asin, 1, 1), "acos": (math.acos, 1, 1), "atan": (math.atan, 1, 1),
    "log": (_log, 1, 2), "log10": (math.log10, 1, 1), "log2": (math.log2, 1, 1),
    "abs": (abs, 1, 1), "round": (_round, 1, 2),
    "min": (lambda *a: min(a), 1, None), "max": (lambda *a: max(a), 1, None),
    "floor": (math.floor, 1, 1), "ceil": (math.ceil, 1, 1),
    "factorial": (_factorial, 1, 1),
}
