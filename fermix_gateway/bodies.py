"""Request bodies from the outside, parsed without trusting them.

A webhook body is signed by the platform, not written by it: a bug there, a proxy in between or
an attacker holding the secret can send anything. Whatever arrives, the gateway answers a 4xx
with a reason, never a 5xx (Telegram and Slack retry every non-2xx, and a 500 invites a
redelivery storm). :class:`MalformedBody` carries that reason; the routes turn it into a 400.
An exception must not escape a route either: Starlette sends the 500 and re-raises, and uvicorn
then closes the connection, so the client's next request on it is reset (issue 13's resets).

Checked here, for every JSON body: strict UTF-8, JSON whose top level is an object, nesting
at most :data:`MAX_DEPTH` deep (Python's decoder raises ``RecursionError`` near 1,000 levels,
and code that walks a parsed tree later might too), and no lone surrogate (``"\\ud800"`` is
valid JSON but not Unicode text: it cannot be encoded to be stored, logged or answered).
"""

from __future__ import annotations

import json
import re
from typing import Any

from fermix_shared.errors import UserInputError

# Telegram updates and Slack events nest about ten levels (Block Kit included).
MAX_DEPTH = 64
# Platform ids (chats, users, timestamps, delivery ids): what a Redis key may hold.
_ID = re.compile(r"[^\s|]{1,200}")
_SURROGATE = "body holds a lone surrogate (\\ud800-\\udfff), which is not Unicode text"


class MalformedBody(UserInputError, ValueError):
    """The body cannot be what the route expects; ``str(e)`` is the reason sent back (400)."""


def is_text(value: str) -> bool:
    """True when ``value`` is Unicode text (no lone surrogate), so it can be encoded."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def is_id(value: object) -> bool:
    """A platform id we can key on: 1-200 characters, no whitespace, no ``|``."""
    return isinstance(value, str) and _ID.fullmatch(value) is not None and is_text(value)


def utf8(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MalformedBody(f"body is not UTF-8 (byte {e.start})") from None


def json_object(body: bytes) -> dict[str, Any]:
    """``body`` as a JSON object, or :class:`MalformedBody` saying why not."""
    text = utf8(body)
    try:
        payload = json.loads(text)
    except RecursionError:
        raise MalformedBody(f"body is JSON nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:
        raise MalformedBody(f"body is not JSON: {e}") from None
    if not isinstance(payload, dict):
        raise MalformedBody("body is not a JSON object")
    _check_tree(payload)
    return payload


def _check_tree(root: dict[str, Any]) -> None:
    """Depth and text of every value, without recursion (the tree may be ~1,000 deep)."""
    stack: list[tuple[Any, int]] = [(root, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > MAX_DEPTH:
                raise MalformedBody(f"body is JSON nested deeper than {MAX_DEPTH} levels")
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                if isinstance(key, str) and not is_text(key):
                    raise MalformedBody(_SURROGATE)
                stack.append((item, depth + 1))
        elif isinstance(value, str) and not is_text(value):
            raise MalformedBody(_SURROGATE)
