"""A fake OpenTelemetry collector on 127.0.0.1: ``POST /v1/traces`` in the OTLP/HTTP protobuf
wire format (what ``opentelemetry-exporter-otlp-proto-http`` sends; gzip too), decoded with the
protocol's own ``ExportTraceServiceRequest``, and kept as :class:`CollectedSpan` s.

    with OTLPCollector() as collector:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": collector.url}
        ...
        spans = collector.wait_for(lambda spans: any(s.name == "fermix.turn" for s in spans))

:meth:`OTLPCollector.wait_for` blocks until the spans received so far satisfy a predicate (each
export wakes it), with a deadline: tests wait on an event, never a fixed sleep.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, Self

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

Value = str | bool | int | float | bytes | list[Any] | dict[str, Any] | None


@dataclass(frozen=True)
class CollectedSpan:
    """One span as the collector received it: ids in hex (``parent_span_id`` "" for a root),
    its attributes and its resource's, decoded to Python values."""

    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: int
    start_ns: int
    end_ns: int
    status_code: int
    attributes: dict[str, Value] = field(default_factory=dict)
    resource: dict[str, Value] = field(default_factory=dict)

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def _value(v: AnyValue) -> Value:
    which = v.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return _attributes(v.kvlist_value.values)
    out: Value = getattr(v, which)
    return out


def _attributes(kvs: Any) -> dict[str, Value]:
    pairs: list[KeyValue] = list(kvs)
    return {kv.key: _value(kv.value) for kv in pairs}


def decode(body: bytes) -> list[CollectedSpan]:
    """The spans of one ``ExportTraceServiceRequest``."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    out = []
    for rs in request.resource_spans:
        resource = _attributes(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(CollectedSpan(
                    trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                    parent_span_id=s.parent_span_id.hex(), name=s.name, kind=s.kind,
                    start_ns=s.start_time_unix_nano, end_ns=s.end_time_unix_nano,
                    status_code=s.status.code, attributes=_attributes(s.attributes),
                    resource=resource))
    return out


class OTLPCollector:
    """The collector (module docstring). ``exports`` counts the requests it took."""

    def __init__(self) -> None:
        self._spans: list[CollectedSpan] = []
        self._changed = threading.Condition()
        self.exports = 0
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                try:
                    spans = decode(body)
                except Exception:  # noqa: BLE001 - a malformed body is the sender's bug
                    self.send_error(400, "not an ExportTraceServiceRequest")
                    return
                collector._received(spans)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="otlp-collector")

    @property
    def url(self) -> str:
        """What ``OTEL_EXPORTER_OTLP_ENDPOINT`` takes (the exporter adds ``/v1/traces``)."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def _received(self, spans: list[CollectedSpan]) -> None:
        with self._changed:
            self._spans.extend(spans)
            self.exports += 1
            self._changed.notify_all()

    def spans(self) -> list[CollectedSpan]:
        """Every span received so far, in arrival order."""
        with self._changed:
            return list(self._spans)

    def clear(self) -> None:
        with self._changed:
            self._spans.clear()

    def wait_for(self, done: Callable[[list[CollectedSpan]], bool],
                 timeout: float = 10.0) -> list[CollectedSpan]:
        """Block until ``done(spans)`` holds for the spans received so far; returns them.
        Raises TimeoutError after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not done(list(self._spans)):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"the collector's {len(self._spans)} spans did not "
                                       f"satisfy the wait within {timeout} s")
                self._changed.wait(left)
            return list(self._spans)

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()
