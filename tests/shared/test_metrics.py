"""Metrics: the helpers move the series operators graph, and both processes serve them.

The gateway's ``/metrics`` runs in-process against a private Redis database (db 12); the
worker's endpoint is the prometheus-client HTTP server on a free loopback port.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY

from fermix_dev.procs import free_port
from fermix_gateway.app import create_app
from fermix_shared import metrics
from fermix_shared.hooks import HookRegistry
from fermix_shared.models import RunStatus
from fermix_shared.settings import Settings


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
def gateway_settings(redis_url: str) -> Iterator[Settings]:
    yield Settings(redis_url=redis_url.rsplit("/", 1)[0] + "/12")


def test_counters_move_and_are_exported() -> None:
    before = value("fermix_turns_total", status="stopped")
    metrics.count_turn("stopped")
    metrics.count_turn(RunStatus.stopped)
    metrics.count_turn(RunStatus.running)  # not a turn's end: ignored
    metrics.count_iteration()
    metrics.count_failover("anthropic", "openai")
    metrics.count_retry("openai", "continuation")
    metrics.count_run_accepted("http")
    metrics.count_reaper_recovery("orphan_closed", 2)
    assert value("fermix_turns_total", status="stopped") == before + 2
    assert value("fermix_turns_total", status="running") == 0
    assert value("fermix_failovers_total", from_provider="anthropic", to_provider="openai") >= 1
    assert value("fermix_reaper_recoveries_total", outcome="orphan_closed") >= 2
    text = metrics.render().decode()
    for line in ('fermix_turns_total{status="stopped"}', "fermix_iterations_total",
                 'fermix_retries_total{kind="continuation",provider="openai"}',
                 'fermix_runs_accepted_total{channel="http"}',
                 'fermix_turns_total{status="ok"} '):  # closed sets are exported from zero
        assert line in text


def test_provider_latency_histogram() -> None:
    labels = {"provider": "openai", "model": "gpt-x"}
    before = {b: value("fermix_provider_latency_seconds_bucket", **labels, le=b)
              for b in ("0.1", "120.0")}
    metrics.observe_provider_call("openai", "gpt-x", 3.0)
    with metrics.time_provider_call("openai", "gpt-x"), pytest.raises(RuntimeError):
        raise RuntimeError("a failed call is timed too")
    assert value("fermix_provider_latency_seconds_bucket", **labels, le="0.1") == before["0.1"] + 1
    assert value("fermix_provider_latency_seconds_bucket", **labels, le="120.0") == (
        before["120.0"] + 2
    )


def test_time_tool_counts_outcomes() -> None:
    def counts() -> tuple[float, float, float]:
        return (value("fermix_tool_calls_total", tool="web_fetch", outcome="ok"),
                value("fermix_tool_calls_total", tool="web_fetch", outcome="error"),
                value("fermix_tool_latency_seconds_sum", tool="web_fetch"))

    ok, error, seconds = counts()
    with metrics.time_tool("web_fetch"):
        time.sleep(0.01)
    with metrics.time_tool("web_fetch") as t:
        t.outcome = "error"
    with pytest.raises(ValueError), metrics.time_tool("web_fetch"):
        raise ValueError
    ok2, error2, seconds2 = counts()
    assert (ok2 - ok, error2 - error) == (1, 2)
    assert seconds2 - seconds >= 0.01


def test_gateway_serves_metrics_and_runs_lifecycle_hooks(gateway_settings: Settings) -> None:
    seen: list[str] = []

    class Lifecycle:
        def gateway_start(self, payload: dict[str, Any]) -> None:
            seen.append("start")

        def gateway_stop(self, payload: dict[str, Any]) -> None:
            seen.append("stop")

    hooks = HookRegistry()
    hooks.register("lifecycle", Lifecycle())
    metrics.count_run_accepted("http")
    with TestClient(create_app(gateway_settings, hooks=hooks)) as client:
        assert seen == ["start"]
        resp = client.get("/metrics")
    assert seen == ["start", "stop"]
    assert resp.status_code == 200
    assert resp.headers["content-type"].startswith("text/plain")
    assert 'fermix_runs_accepted_total{channel="http"}' in resp.text
    assert "# TYPE fermix_provider_latency_seconds histogram" in resp.text


def test_worker_metrics_server_on_loopback() -> None:
    port = free_port()
    assert metrics.start_metrics_server(port)
    resp = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
    assert resp.status_code == 200
    assert "fermix_turns_total" in resp.text
    # One process per port: a second server on it is refused, logged, and not fatal.
    assert not metrics.start_metrics_server(port)


def test_gateway_reports_the_fleets_queue_depth_from_redis(gateway_settings: Settings) -> None:
    """What autoscaling reads: tasks waiting for a worker slot, turns running, conversations
    waiting, the same from whichever gateway is scraped."""
    import redis

    from fermix_shared import keys
    from fermix_shared.task_names import QUEUE

    r = redis.Redis.from_url(gateway_settings.redis_url)
    r.flushdb()
    r.rpush(QUEUE, *[f"task-{i}" for i in range(7)])
    r.zadd(keys.active_index(), {"http|a|root": 1, "http|b|root": 2})
    r.zadd(keys.queued_index(), {"http|a|root": 1, "http|c|root": 1, "http|d|root": 1})
    try:
        with TestClient(create_app(gateway_settings, hooks=HookRegistry())) as client:
            text = client.get("/metrics").text
            r.lpop(QUEUE, 5)
            later = client.get("/metrics").text
    finally:
        r.flushdb()
        r.close()
    assert "# TYPE fermix_dispatch_queue_length gauge" in text
    assert "\nfermix_dispatch_queue_length 7\n" in text
    assert "\nfermix_active_turns 2\n" in text
    assert "\nfermix_conversations_waiting 3\n" in text
    assert "\nfermix_dispatch_queue_length 2\n" in later


def test_metrics_answer_without_the_fleet_gauges_when_redis_is_down() -> None:
    """An outage is when the gateway's counters matter most: the scrape still answers."""
    down = Settings(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    metrics.count_run_accepted("http")
    with TestClient(create_app(down, hooks=HookRegistry())) as client:
        resp = client.get("/metrics")
    assert resp.status_code == 200
    assert 'fermix_runs_accepted_total{channel="http"}' in resp.text
    assert "fermix_dispatch_queue_length" not in resp.text
