"""The helm chart rendered by a real helm for the default values and the GPU
production profile: every object valid against the Kubernetes schemas
(strict), and the properties operators rely on."""

from __future__ import annotations

import copy
import re

import kubernetes_validate
import pytest
import yaml

from tests.deploy.tools import (
    CHART,
    COMPOSE_FILE,
    GPU_PROFILE,
    KUBE_VERSION,
    REPO,
    by_kind,
    container,
    env,
    helm,
    one,
    render,
    values_file,
)

# The oldest Kubernetes the chart supports and the newest the validator knows.
KUBE_VERSIONS = [KUBE_VERSION, kubernetes_validate.latest_version()]
# Custom resources have no schema in kubernetes-validate; test_service_monitors checks them.
CUSTOM_KINDS = {"ServiceMonitor"}


def pod_specs(objects: list[dict]) -> list[tuple[str, dict]]:
    return [(d["metadata"]["name"], d["spec"]["template"]["spec"]) for d in by_kind(objects, "Deployment")]


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_object_is_valid_kubernetes(profile_objects, kube_version):
    _, objects = profile_objects
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "Service", "PodDisruptionBudget", "ConfigMap", "HorizontalPodAutoscaler"} <= kinds
    for obj in objects:
        if obj["kind"] in CUSTOM_KINDS:
            continue
        kubernetes_validate.validate(obj, kube_version, strict=True)


def test_strict_validation_rejects_a_misspelt_field(default_objects):
    deployment = copy.deepcopy(one(default_objects, "Deployment", "tulip"))
    container(deployment, "tulip")["readinesProbe"] = {"grpc": {"port": 7070}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSION, strict=True)


@pytest.mark.parametrize("values", [[], [GPU_PROFILE]], ids=["default", "gpu-production"])
def test_helm_lint_passes(helm_bin, values):
    args = ["lint", CHART, "--strict", "--kube-version", KUBE_VERSION]
    for v in values:
        args += ["-f", v]
    out = helm(*args)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "0 chart(s) failed" in out.stdout


def test_gpu_profile_puts_one_gpu_per_tulip_pod_on_gpu_nodes(gpu_objects):
    tulip = one(gpu_objects, "Deployment", "tulip")
    pod = tulip["spec"]["template"]["spec"]
    c = container(tulip, "tulip")
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["runtimeClassName"] == "nvidia"
    assert c["image"].endswith("-cuda")
    assert env(c)["TULIP_DEVICE"] == "cuda"
    # Ivy is CPU-only: no GPU and no GPU toleration.
    ivy = one(gpu_objects, "Deployment", "ivy")
    assert "nvidia.com/gpu" not in str(ivy["spec"]["template"]["spec"])
    # One GPU per pod and no spare GPU: rollouts replace, never surge.
    assert tulip["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}


def test_default_values_need_no_gpu(default_objects):
    tulip = one(default_objects, "Deployment", "tulip")
    c = container(tulip, "tulip")
    assert "nvidia.com/gpu" not in str(tulip)
    assert c["image"].endswith("-cpu")
    assert "runtimeClassName" not in tulip["spec"]["template"]["spec"]


def window(probe: dict) -> int:
    return probe["periodSeconds"] * probe["failureThreshold"]


@pytest.mark.parametrize("name, min_startup", [("default", 300), ("gpu-production", 600)])
def test_tulip_probes(default_objects, gpu_objects, name, min_startup):
    objects = default_objects if name == "default" else gpu_objects
    c = container(one(objects, "Deployment", "tulip"), "tulip")
    grpc_port = int(env(c)["TULIP_PORT"])
    metrics_port = int(env(c)["TULIP_METRICS_PORT"])
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"grpc": grpc_port, "metrics": metrics_port}
    # Startup: the gRPC port opens after the weights are loaded; the window
    # must cover loading a model.
    assert c["startupProbe"]["grpc"] == {"port": grpc_port}
    assert window(c["startupProbe"]) >= min_startup
    # Readiness follows the serving state (NOT_SERVING while draining).
    assert c["readinessProbe"]["grpc"] == {"port": grpc_port}
    # Liveness is the shallow HTTP check, never the engine-bound gRPC path,
    # and tolerates a minute of slow answers before a restart.
    assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "metrics"}
    assert window(c["livenessProbe"]) >= 60


def test_ivy_probes(profile_objects):
    _, objects = profile_objects
    c = container(one(objects, "Deployment", "ivy"), "ivy")
    assert c["startupProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": int(env(c)["IVY_PORT"]), "grpc": int(env(c)["IVY_GRPC_PORT"])}


@pytest.mark.parametrize("component, drain_env", [("tulip", "TULIP_DRAIN_TIMEOUT"), ("ivy", "IVY_DRAIN_TIMEOUT")])
def test_drain_fits_in_the_grace_period(profile_objects, component, drain_env):
    _, objects = profile_objects
    deployment = one(objects, "Deployment", component)
    pod = deployment["spec"]["template"]["spec"]
    c = container(deployment, component)
    drain = float(env(c)[drain_env])
    sleep = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert drain > 0
    assert sleep + drain < pod["terminationGracePeriodSeconds"]


def test_tulip_leaves_dns_before_it_stops_taking_work(profile_objects):
    """Ivy re-resolves the headless Service every IVY_DNS_INTERVAL seconds;
    the preStop sleep must outlast that, so Ivy drops the pod first."""
    _, objects = profile_objects
    tulip = container(one(objects, "Deployment", "tulip"), "tulip")
    ivy = container(one(objects, "Deployment", "ivy"), "ivy")
    assert tulip["lifecycle"]["preStop"]["sleep"]["seconds"] > float(env(ivy)["IVY_DNS_INTERVAL"])


def test_chart_refuses_a_dns_interval_longer_than_the_prestop_sleep(helm_bin):
    out = helm("template", "embed", CHART, "--kube-version", KUBE_VERSION,
               "--set", "ivy.dnsIntervalSeconds=30", "--set", "tulip.preStopSleepSeconds=10")
    assert out.returncode != 0
    assert "tulip.preStopSleepSeconds (10) must exceed ivy.dnsIntervalSeconds (30)" in out.stderr


def test_pdbs_cover_the_pods_and_allow_voluntary_evictions(profile_objects):
    name, objects = profile_objects
    for component in ("ivy", "tulip"):
        pdb = one(objects, "PodDisruptionBudget", component)
        deployment = one(objects, "Deployment", component)
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        selector = pdb["spec"]["selector"]["matchLabels"]
        assert selector.items() <= labels.items()
        assert selector == deployment["spec"]["selector"]["matchLabels"]
    assert one(objects, "PodDisruptionBudget", "tulip")["spec"]["maxUnavailable"] == 1
    # A minAvailable equal to the HPA's floor would block every node drain.
    hpa = one(objects, "HorizontalPodAutoscaler", "ivy")
    assert one(objects, "PodDisruptionBudget", "ivy")["spec"]["minAvailable"] < hpa["spec"]["minReplicas"]


def test_ivy_resolves_the_headless_tulip_service(profile_objects):
    _, objects = profile_objects
    (service,) = [s for s in by_kind(objects, "Service")
                  if s["metadata"]["labels"]["app.kubernetes.io/component"] == "tulip"]
    spec = service["spec"]
    assert spec["clusterIP"] == "None"
    assert spec["publishNotReadyAddresses"] is False
    tulip = one(objects, "Deployment", "tulip")
    assert spec["selector"].items() <= tulip["spec"]["template"]["metadata"]["labels"].items()
    grpc = next(p for p in spec["ports"] if p["name"] == "grpc")
    assert grpc["targetPort"] == "grpc"

    ivy = container(one(objects, "Deployment", "ivy"), "ivy")
    host, port = env(ivy)["IVY_TULIP_DNS"].rsplit(":", 1)
    assert host == f"{service['metadata']['name']}.embeddings.svc.cluster.local"
    assert int(port) == grpc["port"] == int(env(container(tulip, "tulip"))["TULIP_PORT"])
    assert "IVY_TULIP" not in env(ivy)


def test_ivy_service_and_hpa_target_ivy(profile_objects):
    _, objects = profile_objects
    ivy = one(objects, "Deployment", "ivy")
    service = next(s for s in by_kind(objects, "Service")
                   if s["metadata"]["labels"]["app.kubernetes.io/component"] == "ivy")
    assert service["spec"].get("clusterIP") != "None"
    assert service["spec"]["selector"].items() <= ivy["spec"]["template"]["metadata"]["labels"].items()
    named = {p["name"] for p in container(ivy, "ivy")["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} == named
    hpa = one(objects, "HorizontalPodAutoscaler", "ivy")
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                             "name": ivy["metadata"]["name"]}
    # The HPA owns the replica count.
    assert "replicas" not in ivy["spec"]


def test_no_container_runs_as_root(profile_objects):
    _, objects = profile_objects
    for name, pod in pod_specs(objects):
        ctx = pod["securityContext"]
        assert ctx["runAsNonRoot"] is True and ctx["runAsUser"] > 0, name
        assert pod["automountServiceAccountToken"] is False, name
        for c in pod["containers"] + pod.get("initContainers", []):
            sc = c["securityContext"]
            assert sc.get("runAsUser", ctx["runAsUser"]) > 0, (name, c["name"])
            assert sc["runAsNonRoot"] is True, (name, c["name"])
            assert sc["readOnlyRootFilesystem"] is True, (name, c["name"])
            assert sc["allowPrivilegeEscalation"] is False, (name, c["name"])
            assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add"), (name, c["name"])
            # A read-only root needs a writable /tmp for Python, CUDA and Triton caches.
            assert "/tmp" in {m["mountPath"] for m in c["volumeMounts"]}, (name, c["name"])


def test_gpu_profile_reads_the_model_from_its_claim(gpu_objects):
    deployment = one(gpu_objects, "Deployment", "tulip")
    pod = deployment["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "model"]
    assert volume["persistentVolumeClaim"] == {"claimName": "embedding-models", "readOnly": True}
    (mount,) = [m for m in container(deployment, "tulip")["volumeMounts"] if m["name"] == "model"]
    assert mount == {"name": "model", "mountPath": "/models", "readOnly": True}
    model_dir = "/models/intfloat/multilingual-e5-large"
    assert env(container(deployment, "tulip"))["TULIP_MODEL"] == model_dir
    # Ivy gets the tokenizer from the replicas: no model files in its pods.
    ivy = one(gpu_objects, "Deployment", "ivy")
    assert "model" not in {v["name"] for v in ivy["spec"]["template"]["spec"]["volumes"]}
    assert "IVY_TOKENIZER" not in env(container(ivy, "ivy"))
    assert "initContainers" not in ivy["spec"]["template"]["spec"]


def test_default_values_serve_the_embedded_model(default_objects):
    tulip = env(container(one(default_objects, "Deployment", "tulip"), "tulip"))
    ivy = env(container(one(default_objects, "Deployment", "ivy"), "ivy"))
    assert "TULIP_MODEL" not in tulip
    assert "IVY_TOKENIZER" not in ivy
    for deployment in by_kind(default_objects, "Deployment"):
        assert "model" not in {v["name"] for v in deployment["spec"]["template"]["spec"]["volumes"]}


def test_init_hook_fills_a_per_pod_volume_before_the_servers_start(helm_bin):
    objects = render(sets={
        "model.source": "emptyDir", "model.path": "e5", "model.init.enabled": True,
        "model.init.image": "registry.example.com/fetch:1.0", "model.init.args": "{fetch,s3://models/e5}",
    })
    ivy = one(objects, "Deployment", "ivy")["spec"]["template"]["spec"]
    assert "initContainers" not in ivy and "model" not in {v["name"] for v in ivy["volumes"]}
    for component in ("tulip",):
        deployment = one(objects, "Deployment", component)
        pod = deployment["spec"]["template"]["spec"]
        (init,) = pod["initContainers"]
        assert init["image"] == "registry.example.com/fetch:1.0"
        assert init["args"] == ["fetch", "s3://models/e5"]
        assert env(init)["MODEL_DIR"] == "/models/e5"
        init_mount = next(m for m in init["volumeMounts"] if m["name"] == "model")
        assert not init_mount.get("readOnly")
        served = next(m for m in container(deployment, component)["volumeMounts"] if m["name"] == "model")
        assert served["readOnly"] is True
        assert next(v for v in pod["volumes"] if v["name"] == "model")["emptyDir"] == {"sizeLimit": "4Gi"}
    for obj in objects:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def test_service_monitors_scrape_named_metrics_ports(gpu_objects, default_objects):
    assert not by_kind(default_objects, "ServiceMonitor")
    monitors = by_kind(gpu_objects, "ServiceMonitor")
    assert {m["metadata"]["labels"]["app.kubernetes.io/component"] for m in monitors} == {"ivy", "tulip"}
    for m in monitors:
        assert m["apiVersion"] == "monitoring.coreos.com/v1"
        assert m["metadata"]["labels"]["release"] == "prometheus"
        (endpoint,) = m["spec"]["endpoints"]
        assert endpoint["path"] == "/metrics"
        services = [s for s in by_kind(gpu_objects, "Service")
                    if m["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
        assert len(services) == 1
        assert endpoint["port"] in {p["name"] for p in services[0]["spec"]["ports"]}
        assert m["spec"]["namespaceSelector"] == {"matchNames": ["embeddings"]}


def test_tulip_settings_are_real_launcher_flags(profile_objects):
    """Every TULIP_* variable the chart and docker-compose set is one that
    `python -m tulip` reads (a misspelt one would be silently ignored)."""
    from tulip.flags import env_name
    from tulip.launcher import parser

    known = {env_name(o) for a in parser()._actions for o in a.option_strings if o.startswith("--")}
    _, objects = profile_objects
    chart = {k for k in env(container(one(objects, "Deployment", "tulip"), "tulip")) if k.startswith("TULIP_")}
    compose = yaml.safe_load(COMPOSE_FILE.read_text())["services"]["tulip-0"]["environment"]
    assert chart and chart <= known, chart - known
    assert set(compose) <= known, set(compose) - known


def test_capture_list_reaches_tulip(helm_bin):
    objects = render(sets={"tulip.engine.capture": r"1x128\,4x2048", "tulip.engine.graphs": False})
    tulip = env(container(one(objects, "Deployment", "tulip"), "tulip"))
    assert tulip["TULIP_CAPTURE"] == "1x128,4x2048"
    assert tulip["TULIP_GRAPHS"] == "false"


def test_caches_live_on_the_writable_tmp_volume(profile_objects):
    """With a read-only root, every cache the Tulip image points at (HOME,
    XDG, Hugging Face, CUDA, Triton) must sit under /tmp, an emptyDir each
    container mounts writable."""
    dockerfile = (REPO / "deploy" / "tulip.Dockerfile").read_text()
    paths = dict(re.findall(r"\b(HOME|XDG_CACHE_HOME|HF_HOME|CUDA_CACHE_PATH|TRITON_CACHE_DIR)=(\S+)", dockerfile))
    assert {"HOME", "XDG_CACHE_HOME"} <= set(paths), paths
    assert all(p == "/tmp" or p.startswith("/tmp/") for p in paths.values()), paths
    _, objects = profile_objects
    for name, pod in pod_specs(objects):
        volumes = {v["name"]: v for v in pod["volumes"]}
        for c in pod["containers"]:
            (tmp,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
            assert not tmp.get("readOnly"), (name, c["name"])
            assert "emptyDir" in volumes[tmp["name"]], (name, c["name"])


def test_ivy_has_no_tls_and_its_own_connection_defaults_by_default(profile_objects):
    _, objects = profile_objects
    ivy = container(one(objects, "Deployment", "ivy"), "ivy")
    names = set(env(ivy))
    assert not names & {"IVY_TLS_CERT", "IVY_TLS_KEY", "IVY_HEADER_TIMEOUT", "IVY_MAX_CONNECTIONS"}
    assert ivy["readinessProbe"]["httpGet"].get("scheme", "HTTP") == "HTTP"


CONNECTIONS = {"headerTimeoutSeconds": ("IVY_HEADER_TIMEOUT", 5), "bodyTimeoutSeconds": ("IVY_BODY_TIMEOUT", 20),
               "idleTimeoutSeconds": ("IVY_IDLE_TIMEOUT", 90), "writeTimeoutSeconds": ("IVY_WRITE_TIMEOUT", 15),
               "maxConnections": ("IVY_MAX_CONNECTIONS", 2000)}


def test_connection_settings_reach_ivy_and_the_sidecar_as_real_flags(helm_bin):
    sets = {f"ivy.connections.{k}": v for k, (_, v) in CONNECTIONS.items()}
    objects = render(sets={**sets, "tulip.colocatedIvy.enabled": True})
    known = {name for path in (REPO / "ivy" / "src").rglob("*.rs")
             for name in re.findall(r'env = "(IVY_[A-Z_]+)"', path.read_text())}
    for component in ("ivy", "tulip"):
        ivy = env(container(one(objects, "Deployment", component), "ivy"))
        for var, value in CONNECTIONS.values():
            assert var in known, var
            assert ivy[var] == str(value), (component, var)


def test_ivy_tls_from_a_secret(helm_bin):
    objects = render(sets={"ivy.tls.secretName": "ivy-cert", "tulip.colocatedIvy.enabled": True,
                           "metrics.serviceMonitor.enabled": True})
    for component, prefix in (("ivy", ""), ("tulip", "ivy-")):
        deployment = one(objects, "Deployment", component)
        pod = deployment["spec"]["template"]["spec"]
        ivy = container(deployment, "ivy")
        variables = env(ivy)
        (mount,) = [m for m in ivy["volumeMounts"] if m["name"] == f"{prefix}tls"]
        assert mount == {"name": f"{prefix}tls", "mountPath": "/etc/ivy-tls", "readOnly": True}
        assert variables["IVY_TLS_CERT"] == "/etc/ivy-tls/tls.crt"
        assert variables["IVY_TLS_KEY"] == "/etc/ivy-tls/tls.key"
        (volume,) = [v for v in pod["volumes"] if v["name"] == f"{prefix}tls"]
        assert volume["secret"] == {"secretName": "ivy-cert"}
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert ivy[probe]["httpGet"]["scheme"] == "HTTPS", (component, probe)
    annotations = one(objects, "Deployment", "ivy")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scheme"] == "https"
    for m in by_kind(objects, "ServiceMonitor"):
        (endpoint,) = m["spec"]["endpoints"]
        component = m["metadata"]["labels"]["app.kubernetes.io/component"]
        assert endpoint.get("scheme", "http") == ("http" if component == "tulip" else "https"), component
    for obj in objects:
        if obj["kind"] not in CUSTOM_KINDS:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def test_tulip_writes_its_exports_to_a_bounded_cache_volume(default_objects, helm_bin):
    """The CPU fast path's export cache (docs/operations.md, "Disk"): an
    emptyDir with a size limit by default, a claim when one is named, and
    Tulip pointed at it with its bound."""
    deployment = one(default_objects, "Deployment", "tulip")
    tulip = container(deployment, "tulip")
    assert env(tulip)["TULIP_CACHE_DIR"] == "/var/cache/tulip-rose"
    assert env(tulip)["TULIP_CACHE_MAX_BYTES"] == str(2 << 30)
    mount = next(m for m in tulip["volumeMounts"] if m["mountPath"] == "/var/cache/tulip-rose")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mount["name"]]["emptyDir"] == {"sizeLimit": "3Gi"}
    claimed = one(render(sets={"tulip.exportCache.existingClaim": "exports"}), "Deployment", "tulip")
    volumes = {v["name"]: v for v in claimed["spec"]["template"]["spec"]["volumes"]}
    assert volumes[mount["name"]] == {"name": mount["name"], "persistentVolumeClaim": {"claimName": "exports"}}


def test_lora_adapters_reach_tulip_from_a_volume_every_replica_reads(default_objects, helm_bin, tmp_path):
    """tulip.lora as TULIP_LORA (none by default) and tulip.maxAdapters as
    TULIP_MAX_ADAPTERS; tulip.loraVolume's claim mounted read-only in every
    pool's pods (run-time loads read it too); a pool's adapters are its own
    tulip.lora, never the first pool's (another model would refuse them)."""
    tulip = env(container(one(default_objects, "Deployment", "tulip"), "tulip"))
    assert "TULIP_LORA" not in tulip and tulip["TULIP_MAX_ADAPTERS"] == "8"
    values = {"tulip": {"lora": [{"name": "legal", "path": "/adapters/legal"},
                                 {"name": "medical", "path": "/adapters/medical"}],
                        "maxAdapters": 2, "loraVolume": {"existingClaim": "adapters"}},
              "pools": [{"name": "reranker"},
                        {"name": "other", "tulip": {"lora": [{"name": "x", "path": "/adapters/x"}]}}]}
    objects = render(values_file(tmp_path, values))
    adapters = {}
    for component in ("tulip", "tulip-reranker", "tulip-other"):
        deployment = one(objects, "Deployment", component)
        c = container(deployment, "tulip")
        adapters[component] = env(c).get("TULIP_LORA")
        assert env(c)["TULIP_MAX_ADAPTERS"] == "2"
        (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/adapters"]
        assert mount["readOnly"] is True
        volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
        assert volumes[mount["name"]]["persistentVolumeClaim"] == {"claimName": "adapters", "readOnly": True}
    assert adapters == {"tulip": "legal=/adapters/legal,medical=/adapters/medical", "tulip-reranker": None,
                        "tulip-other": "x=/adapters/x"}
    for obj in objects:
        if obj["kind"] not in CUSTOM_KINDS:
            kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)
