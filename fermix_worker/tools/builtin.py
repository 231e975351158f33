"""Built-in tools: the current time, and a safe arithmetic calculator."""

from __future__ import annotations

import ast
import operator
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from fermix_worker.tools.base import Tool, ToolError


def _current_time(args: dict[str, Any]) -> str:
    tz_name = str(args.get("timezone") or "UTC")
    try:
        tz = ZoneInfo(tz_name)
    except (ZoneInfoNotFoundError, ValueError) as e:
        raise ToolError(f"unknown time zone {tz_name!r}") from e
    now = datetime.now(tz)
    return f"{now.isoformat(timespec='seconds')} ({tz_name}, {now.strftime('%A')})"


_OPS: dict[type, Any] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}


def _eval(node: ast.AST) -> float | int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ToolError("exponent too large")
        return _OPS[type(node.op)](left, right)  # type: ignore[no-any-return]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))  # type: ignore[no-any-return]
    raise ToolError("only numbers and + - * / // % ** ( ) are allowed")


def _calculator(args: dict[str, Any]) -> str:
    expr = str(args.get("expression", "")).strip()
    if not expr or len(expr) > 200:
        raise ToolError("expression must be 1-200 characters")
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError as e:
        raise ToolError(f"cannot parse {expr!r}") from e
    try:
        value = _eval(tree.body)
    except ZeroDivisionError as e:
        raise ToolError("division by zero") from e
    return f"{expr} = {value:g}" if isinstance(value, float) else f"{expr} = {value}"


CURRENT_TIME = Tool(
    name="current_time",
    description="The current date and time, in UTC or in the given IANA time zone.",
    parameters={
        "type": "object",
        "properties": {"timezone": {"type": "string", "description": "e.g. Europe/Paris"}},
    },
    run=lambda ctx, args: _current_time(args),
)

CALCULATOR = Tool(
    name="calculator",
    description="Evaluate an arithmetic expression exactly (numbers and + - * / // % ** ( )).",
    parameters={
        "type": "object",
        "properties": {"expression": {"type": "string"}},
        "required": ["expression"],
    },
    run=lambda ctx, args: _calculator(args),
)

BUILTIN_TOOLS = [CURRENT_TIME, CALCULATOR]
