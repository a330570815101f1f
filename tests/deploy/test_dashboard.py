"""The Grafana dashboard against the metric list in deploy/README.md (the
contract the services export): every query reads listed series only, every
listed metric is shown, the names follow Prometheus' conventions, and real
Tulip and Ivy processes export them."""

from __future__ import annotations

import json
import re
import signal
import time

import pytest

from tests.deploy.tools import REPO
from tests.support.servers import Ivy, free_port

DASHBOARD = json.loads((REPO / "deploy" / "grafana" / "dashboards" / "tulip-rose.json").read_text())
TYPES = {"counter", "gauge", "histogram"}
# Series Prometheus itself records for every target.
BUILTIN = {"up"}
# PromQL words that look like metric names but are not.
LABELS = {"api", "endpoint", "status", "error", "stage", "replica", "result", "code", "mode", "model", "class"}
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
        # Durations: histograms in seconds. A gauge may hold seconds too
        # (the backlog: work held, not a measured duration).
        if "duration" in name:
            assert name.endswith("_seconds") and kind == "histogram", name
        if name.endswith("_seconds"):
            assert kind in ("histogram", "gauge"), name
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
                  "graphs captured", "eager", "padding", "replica health", "reloads"]:
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


def exported(text: str) -> dict[str, tuple[str, set[str]]]:
    """metric -> (type, label names seen) from a Prometheus/OpenMetrics text
    exposition; counter families are named with their _total samples."""
    out: dict[str, tuple[str, set[str]]] = {}
    for family, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M):
        name = family + "_total" if kind == "counter" and not family.endswith("_total") else family
        out[name] = (kind, set())
    for sample, labels in re.findall(r"^([a-z_:][a-z0-9_:]*)\{([^}]*)\}", text, re.M):
        name = sample if sample in out else re.sub(r"_(bucket|sum|count)$", "", sample)
        if name in out:
            out[name][1].update(re.findall(r'(\w+)="', labels))
    return out


def check_exports(text: str, prefix: str) -> None:
    listed = {n: v for n, v in contract().items() if n.startswith(prefix)}
    found = exported(text)
    for name, (kind, labels) in listed.items():
        assert name in found, f"{name} is listed in deploy/README.md but not exported"
        assert found[name][0] == kind, (name, found[name][0], kind)
        assert found[name][1] - {"le"} <= labels, (name, found[name][1])


def test_tulip_exports_the_listed_metrics(ivy_minilm, tulip_minilm):
    status, _ = ivy_minilm.post_json("/v1/embeddings", {"input": ["a request, so labelled series exist"]})
    assert status == 200
    check_exports(tulip_minilm.metrics(), "tulip_")


def test_ivy_exports_the_listed_metrics(tulip_minilm, minilm_dir, log_dir, tmp_path):
    config = tmp_path / "templates.toml"
    config.write_text('[prompts]\nquery = "query: "\n')
    # A templates file and one SIGHUP, so the reload counter has a sample.
    ivy = Ivy([tulip_minilm.url], minilm_dir, log_dir=log_dir,
              env={"IVY_CONFIG": str(config), "IVY_GRPC_PORT": str(free_port())})
    try:
        status, body = ivy.get("/metrics")
        assert status == 200
        status, _ = ivy.post_json("/v1/embeddings", {"input": ["a request, so labelled series exist"]})
        assert status == 200
        ivy.signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while "ivy_config_reloads_total{" not in (body := ivy.get("/metrics")[1].decode()):
            assert time.monotonic() < deadline, "no reload counted after SIGHUP"
            time.sleep(0.2)
        check_exports(body, "ivy_")
    finally:
        ivy.stop()
