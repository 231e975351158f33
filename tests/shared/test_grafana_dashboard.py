"""``deploy/grafana-dashboard.json``: a dashboard Grafana imports (its panels on one Prometheus
data source variable), whose every query names only metrics Fermix serves: a renamed metric
fails here, not as an empty panel in someone's Grafana."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import REGISTRY

from fermix_shared import metrics

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana-dashboard.json"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}


def served() -> set[str]:
    """Every sample name the gateway's and the workers' /metrics can hold."""
    names = {name for name, _ in metrics.FLEET_GAUGES}
    for family in REGISTRY.collect():
        if family.name.startswith("fermix_"):
            names |= {family.name + s for s in SUFFIXES.get(family.type, ("",))}
    return names


def test_the_dashboard_queries_only_metrics_fermix_serves() -> None:
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] == "fermix" and dash["templating"]["list"][0]["type"] == "datasource"
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(dash["panels"]) >= 8 and len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    used = {name for e in exprs for name in re.findall(r"\bfermix_[a-z_]+", e)}
    assert used - served() == set()
    # The ones people open it for: per-route latency, tokens and cost by agent and model.
    assert {"fermix_http_request_seconds_bucket", "fermix_tokens_total",
            "fermix_cost_usd_total"} <= used
    for p in dash["panels"]:
        assert p["datasource"]["uid"] == "${datasource}"
