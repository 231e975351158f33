"""The entries of a run's record, in the order they were written (oldest first).

* :class:`Start`: what the turn was built from (the claimed messages as their agent runs them,
  the history, the prompt's parts, remembered facts, skills, the clock): a replay rebuilds the
  first state from it with today's code and configuration.
* :class:`ModelCall`: one model call, by its index in the turn (``i``, 0 first): the request as
  the loop made it (system prompt and tool schemas written when they change; the messages as
  those after the first ``messages_from`` of the previous request of this run) and the response
  as received (text, tool calls, usage, the answering route), or the error it ended with.
* :class:`ToolRun`: one tool call that ran: its name, arguments and result.
* :class:`Steer`: user messages a steer-mode turn took in before model call ``i``.
* :class:`End`: how the turn ended (reply, the approvals' answers, the fan-outs' results).
* :class:`Cut`: the record reached ``[recorder] max_bytes``; nothing after it was kept.

A worker that dies mid-turn leaves what it wrote; the turn's resumption appends after it (a
model call re-issued is written again under the same ``i``: the last one counts). Secrets
are masked before anything is written (:func:`~fermix_shared.logs.secret_values`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, TypeAdapter

from fermix_shared.messages import ChatMessage, ToolCall
from fermix_shared.models import InboundMessage


class Start(BaseModel):
    k: Literal["start"] = "start"
    at: float
    messages: list[InboundMessage]
    history: list[ChatMessage]
    # The prompt's parts: the configured system prompt the agent used, the memory files'
    # section, and what a before_prompt_build hook returned.
    system_prompt: str
    memory_files: str = ""
    prompt_system: str | None = None
    prompt_prepend: str | None = None
    facts: str = ""
    skills: str = ""
    now: float
    model: str
    route_override: str | None = None


class Request(BaseModel):
    model: str
    system: str | None = None  # None: as the previous request of this record
    tools: list[dict[str, Any]] | None = None  # None: as the previous request
    messages_from: int = 0
    messages: list[ChatMessage]
    max_tokens: int
    reasoning_effort: str | None = None
    temperature: float | None = None


class Response(BaseModel):
    content: str
    tool_calls: list[ToolCall] = Field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    model: str = ""
    route: str = ""
    route_model: str = ""
    thinking: str = ""
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0


class CallError(BaseModel):
    type: str
    message: str
    provider: str = ""
    status: int | None = None
    transient: bool = False


class ModelCall(BaseModel):
    k: Literal["model"] = "model"
    i: int
    at: float
    ms: int
    request: Request
    response: Response | None = None
    error: CallError | None = None


class ToolRun(BaseModel):
    k: Literal["tool"] = "tool"
    call: ToolCall
    content: str
    is_error: bool = False
    ms: int = 0


class Steer(BaseModel):
    k: Literal["steer"] = "steer"
    i: int
    texts: list[str]


class End(BaseModel):
    k: Literal["end"] = "end"
    outcome: Literal["final", "failed"]
    reply: str
    text: str
    approvals: dict[str, str] = Field(default_factory=dict)
    # Every tool result of the turn's transcript, by call id: a fan-out's merged result, a
    # refusal, a call the turn was told was interrupted.
    answers: dict[str, ToolRun] = Field(default_factory=dict)


class Cut(BaseModel):
    k: Literal["cut"] = "cut"
    max_bytes: int


Entry = Annotated[Start | ModelCall | ToolRun | Steer | End | Cut, Field(discriminator="k")]
ENTRY: TypeAdapter[Entry] = TypeAdapter(Entry)
