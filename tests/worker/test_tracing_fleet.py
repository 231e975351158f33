"""One turn is one trace, across real processes: a gateway and two ``celery worker`` processes
exporting OTLP/HTTP (protobuf) to a fake collector on 127.0.0.1 (fermix_dev/otlp_collector.py),
one turn whose scripted model fans four subagents out, which run on both workers.

What an operator sees in the trace backend: the gateway's accept as the root, the turn's
segments (started, then resumed when the fan-out came back) as its children, each model call
with the GenAI attributes, the subagents under the fan-out's tool span on two worker processes,
the delivery; the run id on the spans, the trace id on the run record (GET /v1/runs/{id}) and
on the workers' log lines.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fermix_dev.otlp_collector import CollectedSpan, OTLPCollector
from fermix_dev.scripted_llm import ScriptedLLMServer
from fermix_dev.scripted_llm.script import Reply, ToolCallSpec
from tests.conftest import Stack, provider_env, start_stack
from tests.fleet import start, uniq, wait

pytestmark = pytest.mark.fleet

SUBAGENTS = 4


@pytest.fixture(scope="module")
def collector() -> Iterator[OTLPCollector]:
    with OTLPCollector() as c:
        yield c


@pytest.fixture(scope="module")
def stack(redis_url: str, llm: ScriptedLLMServer, logs_dir: Path,
          collector: OTLPCollector) -> Iterator[Stack]:
    env = {**provider_env(llm, "openai"),
           "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
           "OTEL_TRACES_SAMPLER": "always_on",
           # Batches leave within 100 ms, so the test waits on spans, not on the batch timer.
           "OTEL_BSP_SCHEDULE_DELAY": "100"}
    # Two slots each: the parent holds one of its worker's while it fans out, so the other
    # worker must take some of the four subagents (prefetch is one message per slot).
    s = start_stack("tracing", redis_url, 10, env, logs_dir, workers=2, concurrency=2)
    yield s
    s.stop()


def by_id(spans: list[CollectedSpan]) -> dict[str, CollectedSpan]:
    return {s.span_id: s for s in spans}


def ancestors(span: CollectedSpan, index: dict[str, CollectedSpan]) -> list[CollectedSpan]:
    out = []
    while span.parent_span_id and span.parent_span_id in index:
        span = index[span.parent_span_id]
        out.append(span)
    return out


def complete(trace_id: str, spans: list[CollectedSpan]) -> bool:
    """Everything of the turn has arrived: the accept, both turn segments, the four
    subagents (each with its model call), the parent's two calls and the delivery."""
    mine = [s for s in spans if s.trace_id == trace_id]
    names = [s.name for s in mine]
    return ("fermix.accept" in names and names.count("fermix.turn") >= 2
            and "fermix.deliver" in names
            and sum(1 for s in mine if s.name == "fermix.subagent"
                    and s.attributes.get("fermix.subagent.outcome") == "completed") == SUBAGENTS
            and sum(1 for s in mine if s.attributes.get("gen_ai.operation.name") == "chat")
            >= SUBAGENTS + 2)


def test_one_turn_with_subagents_on_two_workers_is_one_trace(
    stack: Stack, llm: ScriptedLLMServer, collector: OTLPCollector
) -> None:
    user = uniq("traced")
    tasks = [uniq(f"part{i}") for i in range(SUBAGENTS)]
    llm.script.push(
        Reply(tool_calls=[ToolCallSpec("subagents", {"tasks": tasks})], match=user),
        # Each subagent takes a moment, so all four are running at once across the workers.
        *[Reply(text=f"found {t}", delay=0.8, match=t) for t in tasks],
        Reply(text=f"synthesized for {user}", match=user),
    )
    with stack.http() as http:
        run_id = start(http, user, uniq("chat"))
        run = wait(http, run_id, timeout=30)
    assert run["status"] == "ok" and run["reply"] == f"synthesized for {user}"
    # The run names its trace ...
    trace_id = run["traceId"]
    assert len(trace_id) == 32 and int(trace_id, 16) != 0
    spans = [s for s in collector.wait_for(lambda got: complete(trace_id, got), timeout=10)
             if s.trace_id == trace_id]
    index = by_id(spans)

    # ... and every span of the run is in that one trace (the run id on each says whose).
    assert {s.trace_id for s in collector.spans()
            if s.attributes.get("fermix.run_id") == run_id} == {trace_id}

    (accept,) = [s for s in spans if s.name == "fermix.accept"]
    assert accept.parent_span_id == "" and accept.resource["service.name"] == "fermix-gateway"
    assert accept.attributes["fermix.run_id"] == run_id
    assert accept.attributes["fermix.accept.outcome"] == "queued"

    turns = [s for s in spans if s.name == "fermix.turn"]
    assert sorted(str(t.attributes["fermix.turn.entry"]) for t in turns) == [
        "after_fanout", "start"]
    for t in turns:
        assert t.parent_span_id == accept.span_id
        assert t.attributes["fermix.run_id"] == run_id
        assert t.attributes["fermix.conversation"] == run["conversation"]["channel"] + "|" + \
            run["conversation"]["chatId"] + "|root"
        assert t.attributes["fermix.agent"] == "default"
        assert str(t.attributes["fermix.worker"]).startswith("tracing-w")
        assert t.resource["service.name"] == "fermix-worker"
    first = next(t for t in turns if t.attributes["fermix.turn.entry"] == "start")
    resumed = next(t for t in turns if t.attributes["fermix.turn.entry"] == "after_fanout")
    assert (first.attributes["fermix.turn.outcome"],
            resumed.attributes["fermix.turn.outcome"]) == ("Parked", "Delivered")

    # The parent's model calls: children of its turn segments, with the GenAI attributes.
    parent_calls = [s for s in spans if s.attributes.get("gen_ai.operation.name") == "chat"
                    and index[s.parent_span_id].name == "fermix.turn"]
    assert [index[c.parent_span_id].attributes["fermix.turn.entry"]
            for c in sorted(parent_calls, key=lambda c: c.start_ns)] == ["start", "after_fanout"]
    for c in parent_calls:
        a = c.attributes
        assert c.name == "chat scripted-openai"
        assert (a["gen_ai.provider.name"], a["gen_ai.request.model"],
                a["gen_ai.response.model"]) == ("openai", "scripted-openai", "scripted-openai")
        assert int(str(a["gen_ai.usage.input_tokens"])) > 0
        assert int(str(a["gen_ai.usage.output_tokens"])) > 0
        assert "gen_ai.usage.cache_read.input_tokens" in a and "fermix.cost_usd" in a
        assert a["fermix.run_id"] == run_id
    assert sorted(tuple(c.attributes["gen_ai.response.finish_reasons"])  # type: ignore[arg-type]
                  for c in parent_calls) == [("stop",), ("tool_calls",)]

    # The fan-out: its tool span in the first segment, the subagents under it, on two
    # worker processes, each with its own model call.
    (fanout,) = [s for s in spans if s.name == "execute_tool subagents"]
    assert fanout.parent_span_id == first.span_id
    assert fanout.attributes["fermix.subagents"] == SUBAGENTS
    subagents = [s for s in spans if s.name == "fermix.subagent"
                 and s.attributes["fermix.subagent.outcome"] == "completed"]
    assert sorted(int(str(s.attributes["fermix.subagent.index"])) for s in subagents) == list(
        range(SUBAGENTS))
    for s in subagents:
        assert first in ancestors(s, index) and accept == ancestors(s, index)[-1]
        assert s.attributes["fermix.run_id"] == run_id
        (call,) = [c for c in spans if c.parent_span_id == s.span_id
                   and c.attributes.get("gen_ai.operation.name") == "chat"]
        assert call.resource == s.resource
    processes = {(s.resource["service.instance.id"], s.resource["process.pid"])
                 for s in subagents}
    assert len(processes) == 2, processes
    assert {s.resource["process.pid"] for s in spans if s.name == "fermix.subagent"} == {
        w.pid for w in stack.workers}

    # The delivery closes the resumed segment, inside its finish.
    (deliver,) = [s for s in spans if s.name == "fermix.deliver"]
    (finish,) = [s for s in spans if s.name == "fermix.finish"]
    assert (deliver.parent_span_id, finish.parent_span_id) == (finish.span_id, resumed.span_id)
    assert deliver.attributes["fermix.delivery.result"] == "Released"
    # The steps between (benchmarks/waterfall.py): the gateway's publish of the dispatch under
    # the accept, the claim in the worker that took it, and the first segment's own steps.
    publishes = [s for s in spans if s.name == "fermix.publish"
                 and s.parent_span_id == accept.span_id]
    assert [p.attributes["fermix.task"] for p in publishes] == ["fermix.conversation.dispatch"]
    (claim,) = [s for s in spans if s.name == "fermix.claim"]
    assert claim.parent_span_id == accept.span_id and claim.end_ns <= first.start_ns
    assert claim.resource == first.resource and claim.attributes["fermix.run_id"] == run_id
    for name in ("fermix.admit", "fermix.prepare", "fermix.first_writes", "fermix.run_start",
                 "fermix.checkpoint", "fermix.record"):
        assert any(first in ancestors(s, index) for s in spans if s.name == name), name

    # No message text in any span: not the user's, not a subagent's task.
    for s in spans:
        shown = repr(s.attributes)
        assert user not in shown and not any(t in shown for t in tasks)

    # From a log line to the trace: the workers' lines inside the turn carry its id.
    logs = "".join((stack.logs / f"tracing-w{i}.log").read_text() for i in (1, 2))
    assert f"trace_id={trace_id}" in logs


def test_a_request_that_carries_a_traceparent_continues_its_callers_trace(
    stack: Stack, llm: ScriptedLLMServer, collector: OTLPCollector
) -> None:
    # An instrumented API client's span: the turn's trace is the client's, under its span.
    caller_trace, caller_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    text = uniq("carried")
    llm.script.push(Reply(text="carried on", match=text))
    with stack.http() as http:
        resp = http.post("/v1/agent", json={"message": text, "chatId": uniq("tp")},
                         headers={"traceparent": f"00-{caller_trace}-{caller_span}-01"})
        assert resp.status_code == 202, resp.text
        run = wait(http, resp.json()["runId"])
    assert run["status"] == "ok" and run["traceId"] == caller_trace

    def exported(spans: list[CollectedSpan]) -> bool:  # the gateway's and the worker's
        return {"fermix.accept", "fermix.turn", "fermix.deliver"} <= {
            s.name for s in spans if s.trace_id == caller_trace}

    spans = [s for s in collector.wait_for(exported, timeout=20) if s.trace_id == caller_trace]
    (accept,) = [s for s in spans if s.name == "fermix.accept"]
    assert accept.parent_span_id == caller_span
    (turn,) = [s for s in spans if s.name == "fermix.turn"]
    assert turn.parent_span_id == accept.span_id
