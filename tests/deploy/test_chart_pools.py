"""The chart with several model pools behind one Ivy (issue 29 item 1):
`pools` renders one more Tulip Deployment, headless Service and PDB per
model, each selecting only its own pods, and Ivy discovers them all through
one IVY_TULIP_DNS list; rendered by a real helm, every object valid against
the Kubernetes schemas (strict). The default (no pools) is checked by
test_chart_render.py and stays one pool."""

from __future__ import annotations

import kubernetes_validate
import pytest

from tests.deploy.tools import CHART, KUBE_VERSION, by_kind, container, env, helm, one, render, values_file

RERANKER = {"name": "reranker",
            "model": {"source": "pvc", "path": "BAAI/bge-reranker-base", "id": "BAAI/bge-reranker-base",
                      "pvc": {"claimName": "models"}},
            "tulip": {"replicas": 1}}


@pytest.fixture(scope="module")
def two_pools(helm_bin, tmp_path_factory) -> list[dict]:
    values = values_file(tmp_path_factory.mktemp("pools"), {"pools": [RERANKER],
                                                           "ivy": {"defaultModel": "all-MiniLM-L6-v2"}})
    return render(values)


def test_two_pools_render_valid_kubernetes(two_pools):
    for obj in two_pools:
        if obj["kind"] != "ServiceMonitor":
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
    names = sorted(d["metadata"]["name"] for d in by_kind(two_pools, "Deployment"))
    assert names == ["embed-tulip-rose-ivy", "embed-tulip-rose-tulip", "embed-tulip-rose-tulip-reranker"]


def test_each_pool_serves_its_model_and_selects_only_its_pods(two_pools):
    first, reranker = one(two_pools, "Deployment", "tulip"), one(two_pools, "Deployment", "tulip-reranker")
    assert first["spec"]["replicas"] == 2 and reranker["spec"]["replicas"] == 1
    tulip_env = env(container(reranker, "tulip"))
    assert tulip_env["TULIP_MODEL"] == "/models/BAAI/bge-reranker-base"
    assert tulip_env["TULIP_MODEL_ID"] == "BAAI/bge-reranker-base"
    volumes = {v["name"]: v for v in reranker["spec"]["template"]["spec"]["volumes"]}
    assert volumes["model"]["persistentVolumeClaim"]["claimName"] == "models"
    # The first pool keeps the embedded model and its selector (upgrades keep working).
    assert "TULIP_MODEL" not in env(container(first, "tulip"))
    selectors = {}
    for kind in ("Service", "PodDisruptionBudget"):
        for component in ("tulip", "tulip-reranker"):
            obj = one(two_pools, kind, component)
            spec = obj["spec"]
            selectors[kind, component] = spec.get("selector", {}).get("matchLabels", spec.get("selector"))
    for component, deployment in (("tulip", first), ("tulip-reranker", reranker)):
        pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
        for kind in ("Service", "PodDisruptionBudget"):
            assert selectors[kind, component].items() <= pod_labels.items()
        other = "tulip-reranker" if component == "tulip" else "tulip"
        assert not selectors["Service", other].items() <= pod_labels.items(), "a Service selects another pool's pods"


def test_ivy_discovers_every_pool(two_pools):
    ivy_env = env(container(one(two_pools, "Deployment", "ivy"), "ivy"))
    assert ivy_env["IVY_TULIP_DNS"] == ("embed-tulip-rose-tulip.embeddings.svc.cluster.local:7070,"
                                        "embed-tulip-rose-tulip-reranker.embeddings.svc.cluster.local:7070")
    assert ivy_env["IVY_DEFAULT_MODEL"] == "all-MiniLM-L6-v2"


def test_no_pools_changes_nothing(default_objects):
    ivy_env = env(container(one(default_objects, "Deployment", "ivy"), "ivy"))
    assert ivy_env["IVY_TULIP_DNS"] == "embed-tulip-rose-tulip.embeddings.svc.cluster.local:7070"
    assert "IVY_DEFAULT_MODEL" not in ivy_env


@pytest.mark.parametrize("pools,words", [
    ([RERANKER, RERANKER], "used twice"),
    ([{"name": "Bad_Name"}], "name"),
])
def test_bad_pools_are_refused(helm_bin, tmp_path, pools, words):
    out = helm("template", "x", CHART, "-f", values_file(tmp_path, {"pools": pools}))
    assert out.returncode != 0 and words in out.stderr, out.stderr
