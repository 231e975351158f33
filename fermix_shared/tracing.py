"""Tracing: one OpenTelemetry trace per turn, off unless the environment asks for it.

* **On or off, once per process.** :func:`setup` (the gateway's lifespan, the worker's
  bootstep) reads the standard variables: tracing is on when ``OTEL_EXPORTER_OTLP_ENDPOINT``
  (or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) or ``OTEL_TRACES_EXPORTER`` is set, and off when
  ``OTEL_TRACES_EXPORTER=none`` or ``OTEL_SDK_DISABLED=true``. Off, the SDK is never imported:
  :func:`tracer` is OpenTelemetry's no-op tracer and :func:`span` yields the invalid span
  without touching the context. On, spans go through the SDK's ``BatchSpanProcessor`` to the
  OTLP/HTTP (protobuf) exporter, configured by the ``OTEL_*`` variables as the SDK reads them
  (sampler, batch delays, headers, resource attributes).
* **Carried context.** A turn's trace crosses Redis and Celery as a W3C ``traceparent``
  carrier (:data:`Carrier`): the gateway :func:`inject` s it into the inbox message at accept,
  a subagent job and a fan-out's callback carry it too, and the worker starts its spans
  :func:`span_from` it.
* **No secrets.** Spans carry ids, names, counts, models, durations and outcomes: never a
  message's text, a tool's arguments or results, or a key.

The spans are made at the existing seams (docs/features/tracing.md lists them); this module
knows nothing of turns, models or tools beyond the attribute names they share.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind, Status, StatusCode, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:  # the SDK is imported only when tracing is on
    from opentelemetry.sdk.trace import TracerProvider

__all__ = [
    "Carrier",
    "SpanKind",
    "StatusCode",
    "approval_wait",
    "carried",
    "current_trace_id",
    "enabled",
    "flush",
    "inject",
    "install",
    "past_span",
    "setup",
    "span",
    "span_from",
    "trace_id_of",
    "tracer",
    "waited_for_approval",
    "wanted",
]

log = logging.getLogger(__name__)

# A W3C trace-context carrier: ``{"traceparent": "00-<trace id>-<span id>-<flags>"}``.
Carrier = dict[str, str]
Attributes = Mapping[str, str | int | float | bool | list[str]]

TRACER_NAME = "fermix"
_PROPAGATOR = TraceContextTextMapPropagator()
_NOOP: Tracer = trace.NoOpTracer()
_tracer: Tracer = _NOOP
_provider: TracerProvider | None = None
_lock = threading.Lock()
_checked = False
# The approval a resumed call waited for (approval_wait): call id, seconds, answer.
_APPROVAL_KEY = otel_context.create_key("fermix.approval_wait")


# -- set-up ------------------------------------------------------------------------------------


def wanted(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the environment asks for traces (module docstring)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters == "none":
        return False
    return bool(exporters or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def setup(service: str, instance: str, environ: Mapping[str, str] | None = None) -> bool:
    """Turn tracing on for this process if the environment asks for it (checked once: later
    calls return what the first decided). ``service`` names the role (``OTEL_SERVICE_NAME``
    wins), ``instance`` this process (``service.instance.id``; ``process.pid`` is added)."""
    global _checked
    with _lock:
        if _checked:
            return _provider is not None
        _checked = True
        env = os.environ if environ is None else environ
        if not wanted(env):
            return False
        provider = _build(service, instance, env)
    install(provider)
    log.info("tracing on: %s spans of %s go to %s", service, instance,
             ", ".join(_exporter_names(env)))
    return True


def _exporter_names(env: Mapping[str, str]) -> list[str]:
    names = [n.strip().lower() for n in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",")]
    return [n for n in names if n and n != "none"] or ["otlp"]


def _build(service: str, instance: str, env: Mapping[str, str]) -> TracerProvider:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        ConsoleSpanExporter,
        SpanExporter,
    )

    attributes: dict[str, str | int] = {"service.instance.id": instance, "process.pid": os.getpid()}
    if not env.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = service
    # Resource.create adds OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME; the sampler and the
    # batch processor read OTEL_TRACES_SAMPLER and OTEL_BSP_* themselves.
    provider = TracerProvider(resource=Resource.create(attributes))
    for name in _exporter_names(env):
        exporter: SpanExporter
        if name == "console":
            exporter = ConsoleSpanExporter()
        else:
            if name != "otlp":
                log.warning("OTEL_TRACES_EXPORTER=%s is not supported; exporting OTLP", name)
            protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                               env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"))
            if protocol != "http/protobuf":
                log.warning("OTLP protocol %s is not supported; using http/protobuf", protocol)
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def install(provider: TracerProvider | None) -> TracerProvider | None:
    """Make ``provider`` this process's (None: tracing off); returns the one it replaces.
    :func:`setup` calls it; tests install one with an in-memory exporter."""
    global _provider, _tracer
    previous, _provider = _provider, provider
    _tracer = _NOOP if provider is None else provider.get_tracer(TRACER_NAME)
    return previous


def enabled() -> bool:
    """Whether spans are recorded in this process."""
    return _provider is not None


def tracer() -> Tracer:
    """This process's tracer: OpenTelemetry's no-op one while tracing is off."""
    return _tracer


def flush(timeout_s: float = 5.0) -> None:
    """Export the spans still batched (a process's shutdown: the gateway's lifespan end, the
    worker's pool end). Never raises: a collector that is down costs only its spans."""
    if _provider is None:
        return
    try:
        _provider.force_flush(int(timeout_s * 1000))
    except Exception as e:  # noqa: BLE001 - telemetry never fails a shutdown
        log.warning("could not flush the last spans: %s", e)


# -- spans and their context ---------------------------------------------------------------------


@contextmanager
def span(name: str, attributes: Attributes | None = None,
         kind: SpanKind = SpanKind.INTERNAL) -> Iterator[Span]:
    """A span, child of the current one, current inside the block. An exception leaving the
    block sets its error status and ``error.type`` (the class name only: an exception's text
    may quote what a span must not carry). Off: the invalid span, nothing else."""
    if _provider is None:
        yield INVALID_SPAN
        return
    with _started(name, None, attributes, kind) as s:
        yield s


@contextmanager
def span_from(carrier: Mapping[str, str] | None, name: str,
              attributes: Attributes | None = None,
              kind: SpanKind = SpanKind.INTERNAL) -> Iterator[Span]:
    """As :func:`span`, its parent the context ``carrier`` carried across processes (a new
    trace when it carries none)."""
    if _provider is None:
        yield INVALID_SPAN
        return
    parent = _PROPAGATOR.extract(dict(carrier or {}), context=otel_context.Context())
    with _started(name, parent, attributes, kind) as s:
        yield s


@contextmanager
def _started(name: str, parent: otel_context.Context | None, attributes: Attributes | None,
             kind: SpanKind) -> Iterator[Span]:
    with _tracer.start_as_current_span(name, context=parent, kind=kind, attributes=attributes,
                                       record_exception=False,
                                       set_status_on_exception=False) as s:
        try:
            yield s
        except BaseException as e:
            s.set_attribute("error.type", type(e).__qualname__)
            s.set_status(Status(StatusCode.ERROR, type(e).__qualname__))
            raise


def past_span(carrier: Mapping[str, str] | None, name: str, start_ns: int,
              end_ns: int | None = None, attributes: Attributes | None = None) -> None:
    """A span that already happened (from ``start_ns`` to ``end_ns``, now by default; ns since
    the epoch), child of the context ``carrier`` carried: a step whose parent was not known
    when it began (a dispatch, before its claim reads the message) or that ran in another
    thread (the gateway's publisher). Off: nothing."""
    if _provider is None:
        return
    parent = _PROPAGATOR.extract(dict(carrier or {}), context=otel_context.Context())
    s = _tracer.start_span(name, context=parent, attributes=attributes, start_time=start_ns)
    s.end(end_time=end_ns)


def carried(headers: Mapping[str, str]) -> Carrier:
    """The W3C trace context an incoming request carries (``traceparent``, ``tracestate``);
    empty when it carries none."""
    return {k: headers[k] for k in ("traceparent", "tracestate") if headers.get(k)}


def inject() -> Carrier | None:
    """The current span's context as a carrier (None when tracing is off or no span is
    current): what a message or task takes across a process boundary."""
    if _provider is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: Carrier = {}
    _PROPAGATOR.inject(carrier)
    return carrier or None


def current_trace_id() -> str | None:
    """The current span's trace id (32 hex digits), or None (no span, or tracing off)."""
    if _provider is None:
        return None
    ctx = trace.get_current_span().get_span_context()
    return trace.format_trace_id(ctx.trace_id) if ctx.is_valid else None


def trace_id_of(carrier: Mapping[str, str] | None) -> str | None:
    """The trace id a carrier names, or None."""
    if not carrier:
        return None
    parent = _PROPAGATOR.extract(dict(carrier), context=otel_context.Context())
    ctx = trace.get_current_span(parent).get_span_context()
    return trace.format_trace_id(ctx.trace_id) if ctx.is_valid else None


# -- a call that waited for a person -------------------------------------------------------------


@contextmanager
def approval_wait(call_id: str, seconds: float, answer: str) -> Iterator[None]:
    """Inside the block, the call ``call_id`` is known to have waited ``seconds`` for its
    approval, answered ``answer``: its tool span says so (:func:`waited_for_approval`)."""
    if _provider is None:
        yield
        return
    token = otel_context.attach(otel_context.set_value(_APPROVAL_KEY, (call_id, seconds, answer)))
    try:
        yield
    finally:
        otel_context.detach(token)


def waited_for_approval(call_id: str) -> dict[str, Any]:
    """The approval attributes of the call ``call_id`` (empty unless it waited for one)."""
    if _provider is None:
        return {}
    found = otel_context.get_value(_APPROVAL_KEY)
    if not isinstance(found, tuple) or found[0] != call_id:
        return {}
    return {"fermix.approval.wait_s": round(float(found[1]), 3),
            "fermix.approval.answer": str(found[2])}
