"""What every ``/v1`` route shares on the wire and in ``/openapi.json``: the base of its
response models, its error body, and the route class that declares the errors any route may
answer, so that ``/docs`` describes the real responses (issue 32).

A route declares its 2xx body with ``response_model=`` (a model of the module's
``*_bodies``) and its own refusals with ``responses=refusals({404: "why"})``. FastAPI then
checks each body the route returns against its model and writes it with pydantic's
serializer; :class:`V1Route` serializes only the keys the route set (its optional keys stay
absent when unset, as the contract says), and adds to every operation the refusals any route
may answer: 401, 403 and 503, plus 422 for one that takes parameters or a body and 413 for one
that takes a body, each in the app's ``{"error": "<reason>"}`` (app.py renders them; never FastAPI's
``{"detail": [...]}``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from fastapi import APIRouter, Depends
from fastapi.dependencies.utils import get_flat_params
from fastapi.routing import APIRoute
from pydantic import BaseModel, ConfigDict
from pydantic.json_schema import SkipJsonSchema

from fermix_gateway.auth import require_token

# A number the route may give as an integer or a float (a float field would write 1 as 1.0).
Number = int | float
# ``x: str | Absent = None``: a key the route sets only with a value (never ``null``).
Absent = SkipJsonSchema[None]
Responses = dict[int | str, dict[str, Any]]


class Body(BaseModel):
    """A response body the gateway builds: every key declared, so a key a route adds without
    declaring it is a 500 the tests catch, never a field silently dropped."""

    model_config = ConfigDict(extra="forbid")


class OpenBody(BaseModel):
    """A body whose keys are open: made by a worker (a replay's report, an eval's result),
    another release, or the user (a tool call's arguments). Its declared keys are checked;
    the others pass through as they are."""

    model_config = ConfigDict(extra="allow")


class ErrorBody(Body):
    """Every refusal of the ``/v1`` routes but the OpenAI-compatible ones: one sentence,
    ``"<field>: <reason>"`` when one field is at fault."""

    error: str


COMMON_REASONS: dict[int | str, str] = {
    401: "No bearer token, or not a valid one (`WWW-Authenticate: Bearer`).",
    403: "The token's role may not (the reason names the role needed), or a browser's "
         "request the API refuses.",
    413: "The body is larger than `limits.max_body_bytes`.",
    422: "A bad parameter or body (the reason names the field).",
    503: "Redis is unavailable (or the message is not yet on enough replicas, with "
         "`Retry-After`): try again.",
}


def event_stream(description: str, *, named: bool) -> dict[str, Any]:
    """``content`` of a Server-Sent Events answer: each event's ``data`` (JSON), and its
    ``id`` and ``event`` when ``named`` (OpenAPI 3.2's ``itemSchema``, as FastAPI writes its
    own streams; keepalive comments are no events)."""
    fields = {"data": {"type": "string"}, "event": {"type": "string"}, "id": {"type": "string"}}
    return {"text/event-stream": {"itemSchema": {
        "type": "object", "description": description, "properties": fields,
        "required": ["id", "event", "data"] if named else ["data"],
    }}}


def refusals(reasons: Mapping[Any, str], model: Any = ErrorBody) -> Responses:
    """``responses=`` for a route's own refusals: each status with why, in ``model``."""
    return {code: {"model": model, "description": why} for code, why in reasons.items()}


class V1Route(APIRoute):
    """A ``/v1`` route: its body serialized as the route set it, and the refusals any route
    may answer declared (see the module docstring). ``error_model`` is their shape and
    ``common`` their statuses, of which only a route that takes parameters or a body can
    answer ``input_codes``, and only one that takes a body 413 (the OpenAI-compatible routes
    say 400 where the others say 422)."""

    error_model: ClassVar[Any] = ErrorBody
    common: ClassVar[dict[int | str, str]] = COMMON_REASONS
    input_codes: ClassVar[tuple[int, ...]] = (422,)

    def __init__(self, path: str, endpoint: Callable[..., Any], **kwargs: Any) -> None:
        # The keys the route set, no more: unset optional keys stay absent. (Always: the
        # router's decorators pass their own default, False.)
        kwargs["response_model_exclude_unset"] = True
        own = dict(kwargs.get("responses") or {})
        kwargs["responses"] = {**refusals(self.common, self.error_model), **own}
        super().__init__(path, endpoint, **kwargs)
        unanswered = [] if self.body_field else [413]
        if not (self.body_field or get_flat_params(self.dependant)):
            unanswered += self.input_codes
        for code in unanswered:
            if code not in own:
                self.responses.pop(code, None)
                self.response_fields.pop(code, None)


def v1_router(route_class: type[V1Route] = V1Route) -> APIRouter:
    """A router of ``/v1`` routes: any valid token reads (``require_token``)."""
    return APIRouter(prefix="/v1", dependencies=[Depends(require_token)],
                     route_class=route_class)
