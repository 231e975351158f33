"""Bodies of the OpenAI-compatible API (``fermix_gateway/api/openai.py``), in OpenAI's shapes.

Of a request, only what Fermix acts on is modelled: ``model``, ``messages``, ``stream``,
``stream_options`` and ``user``. Anything else an OpenAI client sends (``temperature``,
``max_tokens``, ``tools``, ``n``...) is accepted and ignored: the agent's own configuration
decides how it answers. The responses (a model, the list, a completion, an error) are
modelled whole, as OpenAI's SDKs read them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Coroutine
from typing import Any, ClassVar, Literal
from urllib.parse import quote, unquote

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from fermix_gateway.api.wire import COMMON_REASONS, Body, ErrorBody, V1Route, event_stream
from fermix_gateway.bodies import is_id, is_text
from fermix_shared.errors import UserInputError

MODEL_PREFIX = "fermix/"

ErrorType = Literal["invalid_request_error", "authentication_error", "permission_error",
                    "not_found_error", "conflict_error", "rate_limit_error", "run_error",
                    "server_error"]
_TYPE_OF_STATUS: dict[int, ErrorType] = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 409: "conflict_error", 413: "invalid_request_error",
    429: "rate_limit_error",
}


class TextPart(BaseModel):
    """A content part; only ``text`` parts carry a turn's input."""

    model_config = ConfigDict(extra="allow", strict=True)

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[TextPart] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """``POST /v1/chat/completions`` (see the module docstring for what is ignored). Strict
    types for what is read: ``"stream": "yes"`` is a 400, not a stream."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str = Field(min_length=1, max_length=200)
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None


class BadRequest(UserInputError, ValueError):
    """The request cannot be served as asked; ``str(e)`` is the reason, ``param`` the field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def agent_of_model(model: str) -> str:
    """``fermix/<agent>`` or a bare ``<agent>`` -> the agent's name."""
    return model.removeprefix(MODEL_PREFIX)


def model_id(agent: str) -> str:
    return f"{MODEL_PREFIX}{agent}"


def last_user_text(messages: list[ChatMessage]) -> str:
    """The text of the last ``user`` message: its string, or its text parts joined by a line
    break. Raises :class:`BadRequest` when there is none, or it holds no text, or a part that
    is not text (images and files are not supported)."""
    for i in range(len(messages) - 1, -1, -1):
        msg = messages[i]
        if msg.role != "user":
            continue
        param = f"messages[{i}].content"
        if isinstance(msg.content, str):
            text = msg.content
        else:
            parts = msg.content or []
            if other := sorted({p.type for p in parts if p.type != "text"}):
                raise BadRequest(f"only text content is supported, not {', '.join(other)}", param)
            text = "\n".join(p.text or "" for p in parts)
        if not text.strip():
            raise BadRequest("the last user message must not be empty", param)
        if not is_text(text):
            raise BadRequest("must be Unicode text (a lone surrogate is not)", param)
        return text
    raise BadRequest("messages must include a message with role 'user' (the turn's input)",
                     "messages")


def check_chat_id(value: str, param: str) -> str:
    if not is_id(value):
        raise BadRequest(f"{param}: a conversation id is 1-200 characters without whitespace "
                         "or '|'", param)
    return value


# HTTP header values are Latin-1 on the wire, a chat id any Unicode: ``x-fermix-chat`` carries
# it percent-encoded UTF-8 (RFC 3986), printable ASCII other than "%" as it is ("c1" stays
# "c1", "☃" is "%E2%98%83").
_HEADER_SAFE = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) != "%")


def chat_header(chat: str) -> str:
    """The ``x-fermix-chat`` value that names ``chat`` (see ``_HEADER_SAFE``)."""
    return quote(chat, safe=_HEADER_SAFE)


def chat_of_header(value: str) -> str:
    """The chat an ``x-fermix-chat`` request header names (percent-decoded, as answered)."""
    try:
        chat = unquote(value, errors="strict")
    except UnicodeDecodeError:
        raise BadRequest("x-fermix-chat: a percent-encoded chat id must be UTF-8",
                         "x-fermix-chat") from None
    return check_chat_id(chat, "x-fermix-chat")


def chat_of_idempotency_key(key: str) -> str:
    """The conversation of a request that names none but carries an ``Idempotency-Key``: the
    same for the key's retries (else each request is a fresh conversation)."""
    return f"openai-{hashlib.sha256(key.encode()).hexdigest()[:32]}"


def error_body(message: str, type_: ErrorType, param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """OpenAI's error object: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def error_response(status: int, message: str, *, type_: ErrorType | None = None,
                   param: str | None = None, code: str | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """An OpenAI-shaped error; the type follows the status unless given."""
    kind = type_ or _TYPE_OF_STATUS.get(status, "server_error")
    return JSONResponse(error_body(message, kind, param, code), status_code=status,
                        headers=headers)


def describe_validation(errors: list[Any]) -> tuple[str, str | None]:
    """A validation failure as one sentence, and the first field it names (``param``)."""
    parts, first = [], None
    for e in errors:
        loc = [x for x in e.get("loc", ()) if x not in ("body", "query", "path", "header")]
        if e.get("type") == "json_invalid":
            loc = []  # its loc is a character offset, not a field
        name = "".join(f"[{x}]" if isinstance(x, int) else f".{x}" for x in loc).lstrip(".")
        # A field name or message may echo the client's lone surrogates: keep it encodable.
        name = name.encode("utf-8", "backslashreplace").decode("utf-8")
        msg = str(e.get("msg", "invalid")).encode("utf-8", "backslashreplace").decode("utf-8")
        parts.append(f"{name or 'body'}: {msg}")
        first = first or name or None
    return "; ".join(parts), first


class Model(Body):
    """An agent as a model, ``fermix/<agent>`` (as old as the gateway process)."""

    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(Body):
    """``GET /v1/models``: the agents that answer conversations."""

    object: Literal["list"]
    data: list[Model]


class AssistantMessage(Body):
    """The turn's reply."""

    role: Literal["assistant"]
    content: str


class Choice(Body):
    """The one choice of a completion."""

    index: int
    message: AssistantMessage
    logprobs: None
    finish_reason: Literal["stop"]


class Usage(Body):
    """The run's tokens, from its last checkpoint (zeros for a command)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(Body):
    """``POST /v1/chat/completions`` not streamed: the run's reply (``chatcmpl-<runId>``)."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[Choice]
    usage: Usage


class OpenAIErrorDetail(Body):
    """What went wrong: a sentence, its type, the field at fault and a code (or nulls)."""

    message: str
    type: ErrorType
    param: str | None
    code: str | None


class OpenAIError(Body):
    """Every refusal of the OpenAI-compatible routes, as OpenAI's SDKs read it."""

    error: OpenAIErrorDetail


# With ``stream: true``, the events OpenAI's SDKs read.
CHUNKS = event_stream(
    "`data`: a `chat.completion.chunk` (a first with the role, the content deltas, a last with "
    "`finish_reason: stop`, with `stream_options.include_usage` one more with the usage), "
    "then `[DONE]`; a run that ends `error` or `stopped` ends it with `{\"error\": {...}}`.",
    named=False)


class OpenAIRoute(V1Route):
    """Answers this router's request-validation and HTTP errors (the token check and the body
    limit included) in OpenAI's error shape, leaving the app's own format to the other routes,
    and declares them so. A Redis failure the route does not catch (in the token check) is
    the app's ``{"error": "<reason>"}``."""

    error_model: ClassVar[Any] = OpenAIError
    common: ClassVar[dict[int | str, str]] = {
        400: "A bad request (the reason names the field; `param` too).",
        **{code: why for code, why in COMMON_REASONS.items() if code != 422},
        # Never FastAPI's 422: any other refusal is OpenAI-shaped too.
        "4XX": "Any other refusal (a route not found, a method not allowed...).",
    }
    input_codes: ClassVar[tuple[int, ...]] = (400,)

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        store_down = {503: {"model": OpenAIError | ErrorBody, "description": COMMON_REASONS[503]}}
        kwargs["responses"] = {**store_down, **(kwargs.get("responses") or {})}
        super().__init__(path, endpoint, **kwargs)

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as e:
                message, param = describe_validation(list(e.errors()))
                return error_response(400, message, param=param)
            except HTTPException as e:
                return error_response(e.status_code, str(e.detail),
                                      headers=dict(e.headers) if e.headers else None)

        return route
