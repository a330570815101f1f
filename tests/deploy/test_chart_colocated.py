"""The chart's co-located Ivy (tulip.colocatedIvy): an Ivy sidecar in every
Tulip pod dialing that pod's Tulip over a Unix socket in a shared volume,
rendered by a real helm with the option on, for the default values and the
GPU production profile."""

from __future__ import annotations

import re

import kubernetes_validate
import pytest

from tests.deploy.test_chart_render import KUBE_VERSIONS
from tests.deploy.tools import CHART, GPU_PROFILE, KUBE_VERSION, REPO, by_kind, container, env, helm, one, render

ON = {"tulip.colocatedIvy.enabled": True}
SOCKET = "/run/tulip/tulip.sock"


@pytest.fixture(scope="module", params=["default", "gpu-production"])
def colocated(request, helm_bin) -> tuple[str, list[dict]]:
    values = [GPU_PROFILE] if request.param == "gpu-production" else []
    return request.param, render(*values, sets=ON)


def tulip_pod(objects: list[dict]) -> dict:
    return one(objects, "Deployment", "tulip")["spec"]["template"]["spec"]


def colocated_service(objects: list[dict]) -> dict:
    return one(objects, "Service", "colocated-ivy")


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_object_is_valid_kubernetes(colocated, kube_version):
    _, objects = colocated
    assert {"Deployment", "Service"} <= {o["kind"] for o in objects}  # not an empty loop
    for obj in objects:
        if obj["kind"] != "ServiceMonitor":
            kubernetes_validate.validate(obj, kube_version, strict=True)


@pytest.mark.parametrize("values", [[], [GPU_PROFILE]], ids=["default", "gpu-production"])
def test_helm_lint_passes(helm_bin, values):
    args = ["lint", CHART, "--strict", "--kube-version", KUBE_VERSION, "--set", "tulip.colocatedIvy.enabled=true"]
    for v in values:
        args += ["-f", v]
    out = helm(*args)
    assert out.returncode == 0, out.stdout + out.stderr


def test_sidecar_dials_its_own_tulip_over_the_socket(colocated):
    _, objects = colocated
    tulip = one(objects, "Deployment", "tulip")
    assert [c["name"] for c in tulip_pod(objects)["containers"]] == ["tulip", "ivy"]
    assert env(container(tulip, "tulip"))["TULIP_UNIX_SOCKET"] == SOCKET
    sidecar = env(container(tulip, "ivy"))
    assert sidecar["IVY_TULIP"] == f"unix://{SOCKET}"
    # Ivy refuses --tulip together with --tulip-dns.
    assert "IVY_TULIP_DNS" not in sidecar and "IVY_DNS_INTERVAL" not in sidecar


def test_both_containers_mount_one_memory_volume_at_the_sockets_folder(colocated):
    _, objects = colocated
    pod = tulip_pod(objects)
    folder = SOCKET.rsplit("/", 1)[0]
    mounts = {}
    for c in pod["containers"]:
        (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == folder]
        # Tulip creates the socket, so its mount is writable.
        assert not mount.get("readOnly"), c["name"]
        mounts[c["name"]] = mount["name"]
    assert mounts["tulip"] == mounts["ivy"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mounts["tulip"]]
    assert volume["emptyDir"]["medium"] == "Memory"


def test_service_exposes_the_sidecar_ports(colocated):
    _, objects = colocated
    service = colocated_service(objects)
    tulip = one(objects, "Deployment", "tulip")
    # A virtual IP balancing across the Tulip pods, unlike the headless Service.
    assert service["spec"]["type"] == "ClusterIP" and "clusterIP" not in service["spec"]
    assert service["spec"]["selector"].items() <= tulip["spec"]["template"]["metadata"]["labels"].items()
    sidecar_ports = {p["name"]: p["containerPort"] for p in container(tulip, "ivy")["ports"]}
    tulip_ports = {p["name"] for p in container(tulip, "tulip")["ports"]}
    assert not sidecar_ports.keys() & tulip_ports
    by_name = {p["name"]: p for p in service["spec"]["ports"]}
    assert {p["targetPort"] for p in by_name.values()} == sidecar_ports.keys()
    # Same names and numbers as the Ivy Service: clients change only the host.
    ivy_service = one(objects, "Service", "ivy")
    assert {(p["name"], p["port"]) for p in ivy_service["spec"]["ports"]} == {(n, p["port"]) for n, p in by_name.items()}
    for p in by_name.values():
        assert sidecar_ports[p["targetPort"]] == p["port"]
    # The headless Service Ivy resolves keeps only Tulip's own ports.
    headless = one(objects, "Service", "tulip")
    assert {p["targetPort"] for p in headless["spec"]["ports"]} == tulip_ports


def test_sidecar_shares_the_ivy_deployments_settings(colocated):
    name, objects = colocated
    ivy = container(one(objects, "Deployment", "ivy"), "ivy")
    sidecar = container(one(objects, "Deployment", "tulip"), "ivy")
    for field in ("image", "imagePullPolicy", "securityContext", "resources", "lifecycle"):
        assert sidecar[field] == ivy[field], field

    def probe(p: dict) -> dict:
        return {**p, "httpGet": {**p["httpGet"], "port": "ivy-" + p["httpGet"]["port"]}}

    for field in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert sidecar[field] == probe(ivy[field]), field
    # Every setting but the way to Tulip: API key, templates, tokenizer, limits.
    shared = {k: v for k, v in env(ivy).items() if k not in ("IVY_TULIP_DNS", "IVY_DNS_INTERVAL")}
    assert {k: v for k, v in env(sidecar).items() if k != "IVY_TULIP"} == shared
    if name == "gpu-production":
        assert env(sidecar)["IVY_API_KEY"] == {"secretKeyRef": {"name": "ivy-api-key", "key": "api-key"}}
    # The same templates ConfigMap, mounted as a directory like Ivy's own.
    pod = tulip_pod(objects)
    config_mount = next(m for m in sidecar["volumeMounts"] if m["mountPath"] == "/etc/ivy")
    assert "subPath" not in config_mount and config_mount["readOnly"] is True
    config = next(v for v in pod["volumes"] if v["name"] == config_mount["name"])
    assert config["configMap"]["name"] == one(objects, "ConfigMap", "ivy")["metadata"]["name"]


def test_sidecar_is_non_root_with_a_read_only_root(colocated):
    _, objects = colocated
    pod = tulip_pod(objects)
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] > 0
    for c in pod["containers"]:
        sc = c["securityContext"]
        assert sc["readOnlyRootFilesystem"] is True and sc["runAsNonRoot"] is True, c["name"]
        assert sc["allowPrivilegeEscalation"] is False, c["name"]
        assert sc["capabilities"]["drop"] == ["ALL"] and not sc["capabilities"].get("add"), c["name"]
        assert "/tmp" in {m["mountPath"] for m in c["volumeMounts"]}, c["name"]
    # Each container writes its own /tmp.
    tmp = {c["name"]: next(m["name"] for m in c["volumeMounts"] if m["mountPath"] == "/tmp") for c in pod["containers"]}
    assert tmp["tulip"] != tmp["ivy"]


def test_shutdown_order_and_grace_period(colocated):
    """The sidecar stops taking requests before its Tulip does, and the pod's
    grace period covers both drains."""
    _, objects = colocated
    pod = tulip_pod(objects)
    tulip = container(one(objects, "Deployment", "tulip"), "tulip")
    sidecar = container(one(objects, "Deployment", "tulip"), "ivy")
    tulip_sleep = tulip["lifecycle"]["preStop"]["sleep"]["seconds"]
    ivy_sleep = sidecar["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert ivy_sleep < tulip_sleep
    for sleep, drain in ((tulip_sleep, env(tulip)["TULIP_DRAIN_TIMEOUT"]), (ivy_sleep, env(sidecar)["IVY_DRAIN_TIMEOUT"])):
        assert sleep + float(drain) < pod["terminationGracePeriodSeconds"]


def test_ivy_deployment_and_headless_service_are_unchanged(colocated, default_objects, gpu_objects):
    name, objects = colocated
    before = default_objects if name == "default" else gpu_objects
    for kind, component in (("Deployment", "ivy"), ("Service", "ivy"), ("Service", "tulip"),
                            ("HorizontalPodAutoscaler", "ivy"), ("ConfigMap", "ivy")):
        assert one(objects, kind, component) == one(before, kind, component), (kind, component)


def test_default_render_has_no_sidecar(default_objects, gpu_objects):
    for objects in (default_objects, gpu_objects):
        pod = tulip_pod(objects)
        assert [c["name"] for c in pod["containers"]] == ["tulip"]
        assert "TULIP_UNIX_SOCKET" not in env(pod["containers"][0])
        assert not [v for v in pod["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory"]
        assert not [s for s in by_kind(objects, "Service")
                    if s["metadata"]["labels"]["app.kubernetes.io/component"] == "colocated-ivy"]


def test_sidecar_resources_and_env_can_be_set_apart(helm_bin):
    objects = render(sets={**ON, "tulip.colocatedIvy.resources.requests.cpu": "3",
                           "tulip.colocatedIvy.extraEnv[0].name": "IVY_IO_THREADS",
                           "tulip.colocatedIvy.extraEnv[0].value": "1",
                           "ivy.extraEnv[0].name": "IVY_BALANCE", "ivy.extraEnv[0].value": "round-robin",
                           "tulip.colocatedIvy.service.type": "LoadBalancer"})
    sidecar = container(one(objects, "Deployment", "tulip"), "ivy")
    ivy = container(one(objects, "Deployment", "ivy"), "ivy")
    assert sidecar["resources"] == {"requests": {"cpu": "3"}}
    assert env(sidecar)["IVY_IO_THREADS"] == "1" and env(sidecar)["IVY_BALANCE"] == "round-robin"
    assert "IVY_IO_THREADS" not in env(ivy)
    assert colocated_service(objects)["spec"]["type"] == "LoadBalancer"
    for obj in objects:
        kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def test_sidecar_settings_are_real_flags(colocated):
    """Every variable the sidecar pair gets is one its program reads."""
    from tulip.flags import env_name
    from tulip.launcher import parser

    _, objects = colocated
    tulip_known = {env_name(o) for a in parser()._actions for o in a.option_strings if o.startswith("--")}
    assert "TULIP_UNIX_SOCKET" in tulip_known
    ivy_known = {name for path in (REPO / "ivy" / "src").rglob("*.rs")
                 for name in re.findall(r'env = "(IVY_[A-Z_]+)"', path.read_text())}
    assert set(env(container(one(objects, "Deployment", "tulip"), "ivy"))) <= ivy_known


def test_service_monitor_scrapes_the_sidecars(helm_bin):
    objects = render(GPU_PROFILE, sets=ON)
    (monitor,) = [m for m in by_kind(objects, "ServiceMonitor")
                  if m["metadata"]["labels"]["app.kubernetes.io/component"] == "colocated-ivy"]
    service = colocated_service(objects)
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    # Exactly one Service per monitor: the sidecars are not scraped twice.
    for m in by_kind(objects, "ServiceMonitor"):
        selected = [s for s in by_kind(objects, "Service")
                    if m["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
        assert len(selected) == 1, m["metadata"]["name"]


@pytest.mark.parametrize("sets, message", [
    ({"ivy.port": 7071}, "must differ from tulip.port (7070) and tulip.metricsPort (7071)"),
    ({"ivy.grpcPort": 7070}, "must differ from tulip.port (7070) and tulip.metricsPort (7071)"),
    ({"ivy.preStopSleepSeconds": 10}, "ivy.preStopSleepSeconds (10) must be less than tulip.preStopSleepSeconds (10)"),
], ids=["http port on tulip's metrics port", "grpc port on tulip's port", "sidecar sleeps as long as tulip"])
def test_chart_refuses_sidecar_settings_that_clash_with_tulip(helm_bin, sets, message):
    args = ["template", "embed", CHART, "--kube-version", KUBE_VERSION, "--set", "tulip.colocatedIvy.enabled=true"]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    out = helm(*args)
    assert out.returncode != 0
    assert message in out.stderr, out.stderr
    # Without the sidecar the same values are fine.
    assert helm(*args[:5], *args[7:]).returncode == 0
