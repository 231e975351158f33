"""Tracing off by default and free when off; on, the W3C context a message carries, and the
trace id on log lines (fermix_shared/tracing.py, fermix_shared/logs.py)."""

from __future__ import annotations

import io
import json
import logging

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import INVALID_SPAN

from fermix_shared import tracing
from fermix_shared.logs import install, log_context
from fermix_shared.models import ConversationKey, InboundMessage
from fermix_shared.settings import Settings


@pytest.mark.parametrize(("env", "on"), [
    ({}, False),
    ({"OTEL_SERVICE_NAME": "fermix", "OTEL_TRACES_SAMPLER": "always_on"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
    ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_TRACES_EXPORTER": "none"},
     False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_SDK_DISABLED": "true"},
     False),
])
def test_only_an_exporter_or_an_endpoint_turns_tracing_on(env: dict[str, str], on: bool) -> None:
    assert tracing.wanted(env) is on


def test_off_by_default_no_provider_is_installed_and_the_tracer_is_the_no_op_one() -> None:
    assert tracing.setup("fermix-test", "test:1", environ={}) is False
    assert not tracing.enabled()
    assert isinstance(tracing.tracer(), trace.NoOpTracer)
    # Nothing global was touched: an application's own provider is not ours to set.
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    with tracing.span("fermix.accept", {"fermix.run_id": "run_1"}) as span:
        assert span is INVALID_SPAN
        assert tracing.inject() is None and tracing.current_trace_id() is None
    with tracing.span_from({"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"},
                           "fermix.turn") as span:
        assert span is INVALID_SPAN
    # An inbox message accepted with tracing off carries no context.
    msg = InboundMessage(key=ConversationKey(channel="http", chat_id="c"), text="hi")
    assert msg.trace is None


def test_a_carried_context_makes_the_worker_span_a_child_of_the_accept_span(
    spans: InMemorySpanExporter,
) -> None:
    with tracing.span("fermix.accept") as accept:
        carrier = tracing.inject()
    assert carrier is not None and carrier["traceparent"].startswith("00-")
    # The message crosses Redis as JSON.
    msg = InboundMessage(key=ConversationKey(channel="http", chat_id="c"), text="hi",
                         trace=carrier)
    again = InboundMessage.model_validate_json(msg.model_dump_json())
    with tracing.span_from(again.trace, "fermix.turn"):
        assert tracing.current_trace_id() == tracing.trace_id_of(carrier)
    turn, root = sorted(spans.get_finished_spans(), key=lambda s: s.name, reverse=True)
    assert (root.name, turn.name) == ("fermix.accept", "fermix.turn")
    assert turn.context.trace_id == accept.get_span_context().trace_id
    assert turn.parent is not None and turn.parent.span_id == accept.get_span_context().span_id
    assert tracing.trace_id_of(carrier) == f"{accept.get_span_context().trace_id:032x}"
    # No carrier: a trace of its own, never the current one's.
    with tracing.span("outer"), tracing.span_from(None, "fermix.turn") as alone:
        assert alone.get_span_context().trace_id != accept.get_span_context().trace_id


def test_an_exception_marks_the_span_failed_by_its_type_never_its_text(
    spans: InMemorySpanExporter,
) -> None:
    with pytest.raises(ValueError), tracing.span("fermix.deliver"):
        raise ValueError("sk-secret-in-a-message")
    (span,) = spans.get_finished_spans()
    assert span.status.status_code is trace.StatusCode.ERROR
    assert span.attributes is not None and span.attributes["error.type"] == "ValueError"
    assert "sk-secret" not in json.dumps(dict(span.attributes)) + str(span.status.description)
    assert not span.events  # no exception event, with its message and traceback


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_log_lines_inside_a_span_carry_its_trace_id(
    spans: InMemorySpanExporter, fmt: str,
) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    logger = logging.getLogger("fermix.test_tracing")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        install([handler], Settings(log_format=fmt), environ={})
        logger.info("outside")
        with tracing.span("fermix.turn"), log_context(run_id="run_abc"):
            trace_id = tracing.current_trace_id()
            logger.info("inside")
    finally:
        logger.removeHandler(handler)
    outside, inside = stream.getvalue().splitlines()
    assert trace_id is not None
    if fmt == "json":
        assert "trace_id" not in json.loads(outside)
        assert json.loads(inside)["trace_id"] == trace_id
        assert json.loads(inside)["run_id"] == "run_abc"
    else:
        assert "trace_id" not in outside
        assert inside.endswith(f"[run_abc trace_id={trace_id}] inside")
