"""The Tulip pool's autoscaling as the chart renders it (real helm): the
KEDA ScaledObject checked against KEDA's own CRD schema (vendored,
tests/deploy/schemas/README.md), the plain HPA on external metrics against
the Kubernetes schemas, the chart refusing both at once, and queries that
read only series Tulip and Ivy export (deploy/README.md)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from tests.deploy.test_dashboard import contract
from tests.deploy.tools import CHART, KUBE_VERSION, by_kind, container, env, helm, one, render

KEDA_CRD = Path(__file__).parent / "schemas" / "keda.sh_scaledobjects.yaml"
KEDA = {"tulip.autoscaling.keda.enabled": True}
KEDA_ZERO = {**KEDA, "tulip.autoscaling.minReplicas": 0}
HPA = {"tulip.autoscaling.hpa.enabled": True}


def strict(schema: dict) -> dict:
    """The CRD's schema with unknown fields refused, as the API server's
    strict field validation (kubectl's default) refuses them."""
    s = copy.deepcopy(schema)

    def walk(node):
        if isinstance(node, dict):
            if ("properties" in node and "additionalProperties" not in node
                    and not node.get("x-kubernetes-preserve-unknown-fields")):
                node["additionalProperties"] = False
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(s)
    return s


@pytest.fixture(scope="module")
def scaledobject_schema() -> dict:
    crd = yaml.safe_load(KEDA_CRD.read_text())
    assert crd["spec"]["names"]["kind"] == "ScaledObject"
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return strict(version["schema"]["openAPIV3Schema"])


def validate_all(objects: list[dict], scaledobject_schema: dict) -> None:
    for obj in objects:
        if obj["kind"] == "ScaledObject":
            jsonschema.validate(obj, scaledobject_schema)
        elif obj["kind"] != "ServiceMonitor":
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


@pytest.fixture(scope="module")
def keda_objects(helm_bin) -> list[dict]:
    return render(sets=KEDA_ZERO)


@pytest.fixture(scope="module")
def hpa_objects(helm_bin) -> list[dict]:
    return render(sets=HPA)


def queries(scaled: dict) -> dict[str, str]:
    return {t["name"]: t["metadata"]["query"] for t in scaled["spec"]["triggers"]}


def test_keda_scaledobject_is_valid_against_kedas_crd(keda_objects, scaledobject_schema):
    validate_all(keda_objects, scaledobject_schema)
    scaled = one(keda_objects, "ScaledObject")
    assert scaled["spec"]["scaleTargetRef"]["name"] == one(keda_objects, "Deployment", "tulip")["metadata"]["name"]
    assert scaled["spec"]["minReplicaCount"] == 0
    broken = copy.deepcopy(scaled)
    broken["spec"]["minReplicas"] = 1  # the HPA's spelling, not KEDA's
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, scaledobject_schema)
    # The autoscaler owns the replica count.
    assert "replicas" not in one(keda_objects, "Deployment", "tulip")["spec"]
    assert not [h for h in by_kind(keda_objects, "HorizontalPodAutoscaler")
                if h["spec"]["scaleTargetRef"]["name"].endswith("-tulip")]


def test_keda_triggers_sum_each_class_pinned_to_the_namespace(keda_objects):
    scaled = one(keda_objects, "ScaledObject")
    q = queries(scaled)
    assert set(q) == {"interactive-backlog", "batch-backlog", "held-requests", "recent-tokens"}
    for cls in ("interactive", "batch"):
        query = q[f"{cls}-backlog"]
        assert query.startswith("sum(") and query.endswith(" or vector(0)"), query
        assert f'class="{cls}"' in query and 'namespace="embeddings"' in query
        assert "unless on(instance) (tulip_draining" in query
    triggers = {t["name"]: t for t in scaled["spec"]["triggers"]}
    # A query waits less than a bulk job: the interactive target is the larger
    # per-replica allowance only if the chart's defaults say so; both are set.
    for name in ("interactive-backlog", "batch-backlog"):
        assert float(triggers[name]["metadata"]["threshold"]) > 0
        assert triggers[name]["metadata"]["activationThreshold"] == "0"
    behavior = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleUp"]["stabilizationWindowSeconds"] == 0
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] > 0


def test_every_series_the_autoscaler_reads_is_exported(keda_objects):
    documented = contract()
    for name, query in queries(one(keda_objects, "ScaledObject")).items():
        for metric in re.findall(r"\b((?:tulip|ivy)_[a-z_]+)\{", query):
            assert metric in documented, (name, metric)


def test_scale_from_zero_makes_ivy_hold_requests(keda_objects, helm_bin):
    ivy = env(container(one(keda_objects, "Deployment", "ivy"), "ivy"))
    assert float(ivy["IVY_COLD_START_HOLD"]) > 0
    with_min = render(sets=KEDA)
    assert "IVY_COLD_START_HOLD" not in env(container(one(with_min, "Deployment", "ivy"), "ivy"))
    assert "held-requests" not in queries(one(with_min, "ScaledObject"))


def test_hpa_variant_reads_external_metrics_per_class(hpa_objects, scaledobject_schema):
    validate_all(hpa_objects, scaledobject_schema)
    assert not by_kind(hpa_objects, "ScaledObject")
    hpa = one(hpa_objects, "HorizontalPodAutoscaler", "tulip")
    assert hpa["spec"]["scaleTargetRef"]["name"].endswith("-tulip")
    classes = {m["external"]["metric"]["selector"]["matchLabels"]["class"]: m["external"]["target"]
               for m in hpa["spec"]["metrics"]}
    assert set(classes) == {"interactive", "batch"}
    assert all(t["type"] == "AverageValue" for t in classes.values())
    assert hpa["spec"]["behavior"]["scaleUp"]["policies"]
    assert "replicas" not in one(hpa_objects, "Deployment", "tulip")["spec"]


@pytest.mark.parametrize("sets, message", [
    ({**KEDA, **HPA}, "tulip.autoscaling: enable keda or hpa, not both"),
    ({**HPA, "tulip.autoscaling.minReplicas": 0}, "tulip.autoscaling.minReplicas 0 (scale from zero) needs keda"),
    ({**KEDA, "pools[0].name": "reranker"}, "tulip.autoscaling sizes one Tulip pool"),
])
def test_chart_refuses_conflicting_autoscaling(helm_bin, sets, message):
    args = ["template", "embed", CHART, "--kube-version", KUBE_VERSION]
    for k, v in sets.items():
        args += ["--set", f"{k}={str(v).lower() if isinstance(v, bool) else v}"]
    out = helm(*args)
    assert out.returncode != 0
    assert message in out.stderr, out.stderr


def test_a_pod_the_autoscaler_removes_leaves_dns_then_drains_within_its_grace(keda_objects):
    """Scale-down loses nothing: the preStop sleep outlasts Ivy's DNS
    interval, and the grace period covers the sleep plus Tulip's drain
    (tests/deploy/test_dns_drain.py runs the scale-down under load)."""
    tulip = one(keda_objects, "Deployment", "tulip")
    c = container(tulip, "tulip")
    sleep = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    ivy = env(container(one(keda_objects, "Deployment", "ivy"), "ivy"))
    assert sleep > float(ivy["IVY_DNS_INTERVAL"])
    assert sleep + float(env(c)["TULIP_DRAIN_TIMEOUT"]) < tulip["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]


def test_the_defaults_are_the_replayed_days_choice():
    """values.yaml's thresholds are what `python -m bench autoscale` chose in
    the newest committed run (bench/results/*/autoscale.json)."""
    runs = sorted((CHART.parents[1] / "bench" / "results").glob("*/autoscale.json"))
    assert runs, "no committed autoscale run"
    chosen = json.loads(runs[-1].read_text())["results"]
    rule = chosen["chosen"]["rule"]
    a = yaml.safe_load((CHART / "values.yaml").read_text())["tulip"]["autoscaling"]
    assert a["interactiveTargetSeconds"] == rule["interactive_target_s"]
    assert a["batchTargetSeconds"] == pytest.approx(chosen["batch_target_s"], abs=5e-4)
    assert a["scaleDown"]["stabilizationWindowSeconds"] == rule["down_window"]
    assert (a["scaleUp"]["pods"], a["scaleUp"]["periodSeconds"]) == (rule["up_pods"], rule["up_period"])
    assert (a["scaleDown"]["pods"], a["scaleDown"]["periodSeconds"]) == (rule["down_pods"], rule["down_period"])
    assert a["keda"]["cooldownPeriodSeconds"] == rule["cooldown"]
    assert a["maxReplicas"] == rule["max_replicas"]


BATCH = {"ivy.batch.enabled": True, "ivy.batch.databaseUrlSecret": "batch-db",
         "ivy.batch.objectStoreUrl": "s3://embeddings/batches", "ivy.batch.objectStoreEndpoint": "http://minio:9000",
         "ivy.batch.objectStoreAllowHttp": True, "ivy.batch.objectStoreCredentialsSecret": "batch-s3",
         "ivy.batch.shardLines": 500}


def test_the_batch_api_store_and_its_queue_in_the_autoscaler(helm_bin, scaledobject_schema):
    """ivy.batch: every Ivy pod gets the cluster store (the database URL and
    the bucket's credentials from Secrets), and KEDA reads the Batch API's
    queue, activating a pool at zero; without it neither appears."""
    objects = render(sets={**KEDA_ZERO, **BATCH})
    validate_all(objects, scaledobject_schema)
    ivy = container(one(objects, "Deployment", "ivy"), "ivy")
    e = env(ivy)
    assert e["IVY_BATCH_OBJECT_STORE_URL"] == "s3://embeddings/batches"
    assert (e["AWS_ENDPOINT_URL"], e["AWS_ALLOW_HTTP"], e["IVY_BATCH_SHARD_LINES"]) == ("http://minio:9000", "true",
                                                                                      "500")
    refs = {v["name"]: v["valueFrom"]["secretKeyRef"] for v in ivy["env"] if "valueFrom" in v}
    assert refs["IVY_BATCH_DATABASE_URL"] == {"name": "batch-db", "key": "database-url"}
    assert refs["AWS_SECRET_ACCESS_KEY"] == {"name": "batch-s3", "key": "AWS_SECRET_ACCESS_KEY"}
    assert "IVY_BATCH_MAX_LINES" not in e and "IVY_BATCH_DIR" not in e
    triggers = {t["name"]: t for t in one(objects, "ScaledObject")["spec"]["triggers"]}
    q = triggers["batch-api-backlog"]["metadata"]
    assert q["query"] == 'max(ivy_batch_pending_requests{namespace="embeddings"}) or vector(0)'
    assert (q["threshold"], q["activationThreshold"]) == ("5000", "0")
    assert "batch-api-backlog" not in queries(one(render(sets=KEDA_ZERO), "ScaledObject"))
    assert not [k for k in env(container(one(render(sets=KEDA), "Deployment", "ivy"), "ivy")) if "BATCH" in k]


def test_the_batch_api_without_its_cluster_store_is_refused(helm_bin):
    args = ["template", "embed", CHART, "--kube-version", KUBE_VERSION, "--set", "ivy.batch.enabled=true",
            "--set", "ivy.batch.objectStoreUrl=s3://b"]
    out = helm(*args)
    assert out.returncode != 0 and "ivy.batch.databaseUrlSecret" in out.stderr, out.stderr


def test_the_hpa_variant_reads_the_batch_api_queue(helm_bin, scaledobject_schema):
    objects = render(sets={**HPA, **BATCH})
    validate_all(objects, scaledobject_schema)
    metrics = one(objects, "HorizontalPodAutoscaler", "tulip")["spec"]["metrics"]
    (queue,) = [m["external"] for m in metrics if m["external"]["metric"]["name"] == "ivy_batch_pending_requests"]
    assert queue["target"] == {"type": "AverageValue", "averageValue": "5000"}
    assert len(metrics) == 3
    assert len(one(render(sets=HPA), "HorizontalPodAutoscaler", "tulip")["spec"]["metrics"]) == 2
