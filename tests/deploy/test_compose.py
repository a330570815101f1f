"""docker-compose.yml, loaded by the real docker compose (schema and
references), then its wiring: services, ports, health checks, the Ivy →
Tulip addresses, and the monitoring profile's files."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
from pathlib import Path

import pytest
import yaml

from tests.deploy.tools import COMPOSE_FILE, REPO, run
from tests.support.servers import Ivy, free_port

TULIPS = ["tulip-0", "tulip-1"]


def compose_config(compose_bin: Path, *profiles: str, file: Path = COMPOSE_FILE) -> subprocess.CompletedProcess:
    args: list[str | Path] = [compose_bin, "-f", file, "--project-directory", REPO]
    for p in profiles:
        args += ["--profile", p]
    # Only the file's own defaults: no ports or project names from the caller.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IVY_", "TULIP_", "COMPOSE_", "DOCKER_"))}
    return run([*args, "config", "--format", "json"], env=env)


@pytest.fixture(scope="module")
def config(compose_bin) -> dict:
    out = compose_config(compose_bin)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def monitoring(compose_bin) -> dict:
    out = compose_config(compose_bin, "monitoring")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def seconds(duration: str) -> float:
    """A compose duration ("40s", "1m30s", "2m0s") in seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(h|ms|m|s)", duration)
    assert parts and "".join(n + u for n, u in parts) == duration, duration
    scale = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    return sum(float(n) * scale[u] for n, u in parts)


def test_services_and_profiles(config, monitoring):
    assert set(config["services"]) == {"ivy", *TULIPS}
    assert set(monitoring["services"]) == {"ivy", *TULIPS, "prometheus", "grafana"}


def test_colocated_profile_puts_ivy_on_its_tulips_unix_socket(compose_bin):
    out = compose_config(compose_bin, "colocated")
    assert out.returncode == 0, out.stderr
    cfg = json.loads(out.stdout)
    services = cfg["services"]
    assert set(services) == {"ivy", *TULIPS, "tulip-local", "ivy-local"}
    tulip, ivy = services["tulip-local"], services["ivy-local"]
    socket_path = tulip["environment"]["TULIP_UNIX_SOCKET"]
    assert ivy["environment"]["IVY_TULIP"] == f"unix://{socket_path}"
    # Both mount the one volume at the socket's directory.
    mounts = [{(m["source"], m["target"]) for m in s["volumes"]} for s in (tulip, ivy)]
    assert mounts[0] == mounts[1] and len(mounts[0]) == 1
    [(volume, target)] = mounts[0]
    assert os.path.dirname(socket_path) == target
    # In memory, writable by the images' user, who creates the socket.
    opts = cfg["volumes"][volume]["driver_opts"]
    assert opts["type"] == "tmpfs" and "uid=10001" in opts["o"]
    assert ivy["ports"][0]["published"] != services["ivy"]["ports"][0]["published"]
    assert set(ivy["depends_on"]) == {"tulip-local"}
    assert ivy["healthcheck"] == services["ivy"]["healthcheck"]


def test_compose_rejects_a_dangling_reference(compose_bin, tmp_path):
    broken = yaml.safe_load(COMPOSE_FILE.read_text())
    broken["services"]["ivy"]["depends_on"]["tulip-2"] = {"condition": "service_started"}
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(broken))
    out = compose_config(compose_bin, file=path)
    assert out.returncode != 0
    assert "undefined service" in out.stderr


def test_ivy_addresses_both_tulip_replicas(config):
    services = config["services"]
    urls = services["ivy"]["environment"]["IVY_TULIP"].split(",")
    targets = [urllib.parse.urlsplit(u) for u in urls]
    assert sorted(t.hostname for t in targets) == TULIPS
    for t in targets:
        tulip = services[t.hostname]
        assert t.scheme == "http"
        assert t.port == int(tulip["environment"]["TULIP_PORT"])
        assert str(t.port) in tulip["expose"]
    assert set(services["ivy"]["depends_on"]) == set(TULIPS)


def test_tulip_replicas_run_the_cpu_image_built_here(config):
    for name in TULIPS:
        tulip = config["services"][name]
        assert tulip["build"]["dockerfile"] == "deploy/tulip.Dockerfile"
        assert tulip["build"]["args"] == {"VARIANT": "cpu"}
        assert tulip["image"].endswith("-cpu")
        assert (REPO / tulip["build"]["dockerfile"]).is_file()
    assert (REPO / config["services"]["ivy"]["build"]["dockerfile"]).is_file()


def test_ivy_ports_are_published_on_loopback(config):
    ivy = config["services"]["ivy"]
    published = {p["target"]: p for p in ivy["ports"]}
    assert set(published) == {int(ivy["environment"]["IVY_PORT"]), int(ivy["environment"]["IVY_GRPC_PORT"])}
    assert published[8080]["published"] == "8080"
    assert all(p["host_ip"] == "127.0.0.1" for p in published.values())
    for name in TULIPS:
        assert not config["services"][name].get("ports"), "Tulip is reached through Ivy only"


def test_health_checks_probe_each_service_on_its_own_port(monitoring):
    services = monitoring["services"]
    assert all(s.get("healthcheck", {}).get("test") for s in services.values())
    for name in TULIPS:
        check = " ".join(services[name]["healthcheck"]["test"])
        port = services[name]["environment"]["TULIP_METRICS_PORT"]
        assert f"http://127.0.0.1:{port}/health" in check
        # Model loading must fit in the start period.
        assert seconds(services[name]["healthcheck"]["start_period"]) >= 60
    ivy = services["ivy"]
    assert f"/dev/tcp/127.0.0.1/{ivy['environment']['IVY_PORT']}" in ivy["healthcheck"]["test"][-1]
    assert "GET /ready " in ivy["healthcheck"]["test"][-1]
    assert "127.0.0.1:9090/-/ready" in services["prometheus"]["healthcheck"]["test"][-1]


def test_stop_grace_exceeds_the_drain_timeouts(config):
    for name, drain_var in [("ivy", "IVY_DRAIN_TIMEOUT"), *[(t, "TULIP_DRAIN_TIMEOUT") for t in TULIPS]]:
        service = config["services"][name]
        assert seconds(service["stop_grace_period"]) > float(service["environment"][drain_var])


def test_services_are_hardened(monitoring):
    for name, service in monitoring["services"].items():
        assert service["cap_drop"] == ["ALL"], name
        assert "no-new-privileges:true" in service["security_opt"], name
        image = service["image"]
        assert ":" in image and not image.endswith(":latest"), name
    for name in ["ivy", "prometheus", *TULIPS]:
        assert monitoring["services"][name]["read_only"] is True, name
    for name in TULIPS:
        assert "/tmp" in monitoring["services"][name]["tmpfs"]


def mounts(service: dict) -> dict[str, Path]:
    """Bind mounts of a service: container path -> host path."""
    return {v["target"]: Path(v["source"]) for v in service.get("volumes", []) if v["type"] == "bind"}


def test_prometheus_scrapes_every_service_on_its_metrics_port(monitoring):
    services = monitoring["services"]
    host_file = mounts(services["prometheus"])["/etc/prometheus/prometheus.yml"]
    assert host_file == REPO / "deploy" / "prometheus" / "prometheus.yml"
    scrape = yaml.safe_load(host_file.read_text())
    targets = {job["job_name"]: [t for sc in job["static_configs"] for t in sc["targets"]]
               for job in scrape["scrape_configs"]}
    assert targets["ivy"] == [f"ivy:{services['ivy']['environment']['IVY_PORT']}"]
    assert sorted(targets["tulip"]) == [f"{t}:{services[t]['environment']['TULIP_METRICS_PORT']}" for t in TULIPS]
    assert all(job.get("metrics_path", "/metrics") == "/metrics" for job in scrape["scrape_configs"])


def test_grafana_is_provisioned_from_the_repository(monitoring):
    grafana = monitoring["services"]["grafana"]
    binds = mounts(grafana)
    provisioning = binds["/etc/grafana/provisioning"]
    dashboards = binds["/var/lib/grafana/dashboards"]
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "tulip-rose.yml").read_text())["providers"]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
    assert (dashboards / "tulip-rose.json").is_file()
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (dashboards / Path(home).relative_to("/var/lib/grafana/dashboards")).is_file()
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    url = urllib.parse.urlsplit(source["url"])
    assert url.hostname == "prometheus" and url.port == 9090


def test_tulip_healthcheck_passes_against_a_real_tulip(config, tulip_minilm):
    kind, *cmd = config["services"]["tulip-0"]["healthcheck"]["test"]
    assert kind == "CMD" and cmd[0] == "python"
    compose_port = config["services"]["tulip-0"]["environment"]["TULIP_METRICS_PORT"]

    def check(port: int) -> int:
        local = [sys.executable, *(c.replace(f":{compose_port}/", f":{port}/") for c in cmd[1:])]
        return subprocess.run(local, capture_output=True, timeout=30).returncode

    assert check(tulip_minilm.metrics_port) == 0
    assert check(free_port()) != 0


def ivy_healthcheck(config: dict, port: int) -> list[str]:
    """Ivy's compose health check command, aimed at a local port."""
    kind, *cmd = config["services"]["ivy"]["healthcheck"]["test"]
    assert kind == "CMD"
    compose_port = config["services"]["ivy"]["environment"]["IVY_PORT"]
    return [c.replace(f"/dev/tcp/127.0.0.1/{compose_port}", f"/dev/tcp/127.0.0.1/{port}") for c in cmd]


@pytest.mark.skipif(shutil.which("bash") is None, reason="the health check runs bash")
def test_ivy_healthcheck_passes_when_ready_and_fails_otherwise(config, ivy_minilm, log_dir, minilm_dir):
    assert subprocess.run(ivy_healthcheck(config, ivy_minilm.port), timeout=10).returncode == 0
    # Nothing listening.
    assert subprocess.run(ivy_healthcheck(config, free_port()), timeout=10).returncode != 0
    # Listening but without a healthy replica: /ready answers 503.
    lonely = Ivy([f"http://127.0.0.1:{free_port()}"], minilm_dir, log_dir=log_dir, wait_ready=False,
                 env={"IVY_GRPC_PORT": str(free_port())})
    try:
        assert lonely.get("/ready")[0] == 503
        assert subprocess.run(ivy_healthcheck(config, lonely.port), timeout=10).returncode != 0
    finally:
        lonely.stop()


def test_colocated_override_puts_ivy_on_tulips_unix_socket(compose_bin):
    """deploy/compose.colocated.yml, merged by the real docker compose: one
    volume shared by tulip-0 and Ivy, Tulip told to listen on a socket in it
    and Ivy told to dial that socket."""
    override = REPO / "deploy" / "compose.colocated.yml"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IVY_", "TULIP_", "COMPOSE_", "DOCKER_"))}
    out = run([compose_bin, "-f", COMPOSE_FILE, "-f", override, "--project-directory", REPO,
               "config", "--format", "json"], env=env)
    assert out.returncode == 0, out.stderr
    services = json.loads(out.stdout)["services"]
    socket = services["tulip-0"]["environment"]["TULIP_UNIX_SOCKET"]
    urls = services["ivy"]["environment"]["IVY_TULIP"].split(",")
    assert f"unix://{socket}" in urls and "http://tulip-1:7070" in urls

    def mount(service: str) -> tuple[str, str]:
        # Ivy's Batch API store is a volume of its own.
        vols = [v for v in services[service]["volumes"] if v["type"] == "volume" and v["source"] != "ivy-batches"]
        assert len(vols) == 1, vols
        return vols[0]["source"], vols[0]["target"]

    assert mount("tulip-0") == mount("ivy")
    assert socket.startswith(mount("ivy")[1] + "/")


def test_single_node_profile_serves_through_tulip_rose_serve(compose_bin, config):
    """The single-node profile: the whole stack in one container of the
    Tulip image (which carries Ivy, test_dockerfiles.py), started by
    `tulip-rose serve` with its own variables, opt-in, on its own ports."""
    out = compose_config(compose_bin, "single-node")
    assert out.returncode == 0, out.stderr
    services = json.loads(out.stdout)["services"]
    assert set(services) == {"ivy", *TULIPS, "tulip-rose"}
    assert "tulip-rose" not in config["services"]
    serve = services["tulip-rose"]
    assert serve["image"] == services["tulip-0"]["image"] and serve["build"] == services["tulip-0"]["build"]
    # Exec form, so SIGTERM reaches `serve`, with an init to reap orphans.
    assert serve["entrypoint"] == ["tulip-rose", "serve"] and serve["init"] is True
    env = serve["environment"]
    help_text = " ".join(subprocess.run([sys.executable, "-m", "tulip_rose_cli", "serve", "--help"],
                                        capture_output=True, text=True, check=True, cwd=REPO).stdout.split())
    for name in env:
        assert f"env {name}" in help_text, f"{name} is not a variable `tulip-rose serve` reads"
    published = {p["target"]: p for p in serve["ports"]}
    assert set(published) == {int(env["IVY_PORT"]), int(env["IVY_GRPC_PORT"])}
    assert all(p["host_ip"] == "127.0.0.1" for p in published.values())
    assert not {p["published"] for p in serve["ports"]} & {p["published"] for p in services["ivy"]["ports"]}
    # Ivy drains first, then the replicas: both must fit in the grace period.
    assert seconds(serve["stop_grace_period"]) > 2 * float(env["TULIP_ROSE_DRAIN_TIMEOUT"])
    # Ivy's own readiness check, on the port serve gives Ivy.
    assert serve["healthcheck"]["test"] == services["ivy"]["healthcheck"]["test"]
    assert env["IVY_PORT"] == services["ivy"]["environment"]["IVY_PORT"]
    assert serve["read_only"] is True and serve["cap_drop"] == ["ALL"] and "/tmp" in serve["tmpfs"]
