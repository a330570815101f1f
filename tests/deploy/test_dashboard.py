"""The Grafana dashboard against the metric list in deploy/README.md (the
contract the services export): every query reads listed series only, every
listed metric is shown, and the names follow Prometheus' conventions."""

from __future__ import annotations

import json
import re

import pytest

from tests.deploy.tools import REPO

DASHBOARD = json.loads((REPO / "deploy" / "grafana" / "dashboards" / "tulip-rose.json").read_text())
TYPES = {"counter", "gauge", "histogram"}
# Series Prometheus itself records for every target.
BUILTIN = {"up"}
# PromQL words that look like metric names but are not.
LABELS = {"api", "endpoint", "status", "error", "stage", "replica", "result", "code"}
PROMQL = {"sum", "rate", "increase", "by", "le", "histogram_quantile", "min", "max", "count", "job", "instance",
          *LABELS}


def contract() -> dict[str, tuple[str, set[str]]]:
    """metric -> (type, labels), from the README's table."""
    rows = re.findall(r"^\| `([a-z_:]+)` \| (\w+) \|([^|]*)\|", (REPO / "deploy" / "README.md").read_text(), re.M)
    assert rows, "no metric table in deploy/README.md"
    return {name: (kind, set(re.findall(r"`(\w+)`", labels))) for name, kind, labels in rows}


def queries() -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in DASHBOARD["panels"] for t in p.get("targets", [])]


def series(expr: str) -> set[str]:
    """Metric names a PromQL expression reads."""
    no_strings = re.sub(r'"[^"]*"', '""', expr)
    no_ranges = re.sub(r"\[[^\]]*\]", "", no_strings)
    words = set(re.findall(r"\b[a-z_:][a-z0-9_:]*\b", no_ranges))
    return {w for w in words if w not in PROMQL and ("_" in w or w in BUILTIN)}


def base_metric(name: str, metrics: dict) -> str:
    """A histogram's _bucket/_sum/_count series mapped to the histogram."""
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and metrics.get(name.removesuffix(suffix), ("",))[0] == "histogram":
            return name.removesuffix(suffix)
    return name


def test_metric_names_follow_prometheus_conventions():
    metrics = contract()
    assert len(metrics) >= 20
    for name, (kind, labels) in metrics.items():
        assert kind in TYPES, name
        assert name.startswith(("ivy_", "tulip_")), name
        assert name.endswith("_total") == (kind == "counter"), name
        if "duration" in name or "capture" in name:
            assert kind == "histogram" and name.endswith("_seconds"), name
        # Labels from bounded sets only: never request text, model input or ids.
        assert labels <= LABELS, name


def test_every_query_reads_listed_metrics_only():
    metrics = contract()
    for title, expr in queries():
        names = series(expr)
        assert names, (title, expr)
        for name in names - BUILTIN:
            base = base_metric(name, metrics)
            assert base in metrics, f"panel {title!r} reads {name}, which deploy/README.md does not list"
            kind = metrics[base][0]
            if name != base:
                assert kind == "histogram", name
            elif kind == "histogram":
                pytest.fail(f"panel {title!r} reads histogram {name} without _bucket/_sum/_count")
            if kind == "counter":
                assert re.search(rf"(rate|increase)\({name}\b", expr), f"counter {name} used without rate()"


def test_every_listed_metric_is_on_the_dashboard():
    metrics = contract()
    shown = {base_metric(n, metrics) for _, expr in queries() for n in series(expr)}
    assert set(metrics) == shown - BUILTIN


def test_labels_used_in_queries_are_declared():
    metrics = contract()
    for title, expr in queries():
        listed = series(expr) - BUILTIN
        declared = set().union(*(metrics[base_metric(n, metrics)][1] for n in listed))
        for name in listed:
            for label in re.findall(rf"{name}\{{([a-z_]+)", expr):
                assert label in metrics[base_metric(name, metrics)][1], (title, label)
        for group in re.findall(r"by \(([^)]*)\)", expr):
            labels = {g.strip() for g in group.split(",")} - {"le", "instance"}
            assert labels <= declared, (title, labels)


def test_the_dashboard_covers_what_operators_watch():
    titles = " ".join(p["title"].lower() for p in DASHBOARD["panels"])
    for topic in ["requests per second", "429", "5xx", "latency", "per stage", "queue time", "tokens per engine step",
                  "graphs captured", "replays", "padding", "replica health", "reloads"]:
        assert topic in titles, topic


def test_dashboard_model_is_well_formed():
    assert DASHBOARD["uid"] == "tulip-rose"
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    (variable,) = DASHBOARD["templating"]["list"]
    assert variable["type"] == "datasource" and variable["query"] == "prometheus"
    for panel in DASHBOARD["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["description"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
    # No two panels overlap.
    cells = set()
    for panel in DASHBOARD["panels"]:
        g = panel["gridPos"]
        area = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & area, panel["title"]
        cells |= area
