"""Scripted LLM server speaking the OpenAI Chat Completions and Anthropic Messages wire formats.

Used by tests and by ``fermix dev`` when no API key is configured::

    with ScriptedLLMServer() as srv:
        srv.script.push(Reply("hello"), Fail(429, retry_after=7))
        client = openai.OpenAI(base_url=srv.openai_base_url, api_key="test")
"""

from .script import (
    Disconnect,
    Entry,
    Fail,
    Hang,
    Reply,
    RequestView,
    Script,
    ToolCallSpec,
    Usage,
    default_reply,
    entries_from_json,
    entry_from_json,
)
from .server import ScriptedLLMServer, create_app, main

__all__ = [
    "Disconnect",
    "Entry",
    "Fail",
    "Hang",
    "Reply",
    "RequestView",
    "Script",
    "ScriptedLLMServer",
    "ToolCallSpec",
    "Usage",
    "create_app",
    "default_reply",
    "entries_from_json",
    "entry_from_json",
    "main",
]
