"""``fermix_http_request_seconds`` on the gateway's ``/metrics``: every answered request by
method, route template (never the path: a run id is no label) and status class, a refused
body and a route nobody declared included. The real app in-process (tests/gateway/inprocess)."""

from __future__ import annotations

import re

from fastapi.testclient import TestClient

from tests.gateway.inprocess import gateway


def counts(client: TestClient) -> dict[tuple[str, str, str], float]:
    text = client.get("/metrics").text
    found = re.findall(r'^fermix_http_request_seconds_count\{method="(\w+)",route="([^"]+)",'
                       r'status="(\dxx)"\} ([\d.e+]+)$', text, re.MULTILINE)
    return {(m, r, s): float(n) for m, r, s, n in found}


def test_each_route_is_timed_by_its_template_and_status_class(scratch_redis_url: str) -> None:
    with gateway(scratch_redis_url, max_body_bytes=2_048) as (client, _):
        before = counts(client)
        for _ in range(3):
            assert client.get("/v1/status").status_code == 200
        assert client.get("/v1/runs/run_0123456789abcdef0123456789abcdef").status_code == 404
        assert client.get("/v1/runs/run_fedcba9876543210fedcba9876543210").status_code == 404
        assert client.get("/no/such/path").status_code == 404
        assert client.post("/v1/agent", content=b"x" * 5_000,
                           headers={"Content-Type": "application/json"}).status_code == 413
        after = counts(client)

    def delta(key: tuple[str, str, str]) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta(("GET", "/v1/status", "2xx")) == 3
    assert delta(("GET", "/v1/runs/{run_id}", "4xx")) == 2  # one series for every run id
    assert delta(("GET", "unmatched", "4xx")) == 1
    assert delta(("POST", "/v1/agent", "4xx")) == 1
    assert not any("run_0123" in route for _, route, _ in after)
    text_bucket = 'fermix_http_request_seconds_bucket{le="60.0",method="GET",route="/v1/status"'
    with gateway(scratch_redis_url) as (client, _):
        assert text_bucket in client.get("/metrics").text
