"""The wheels, installed as a user installs them (issue 30): `make
wheels`' build (packaging/wheels.sh), both wheels installed into a fresh
virtualenv through the `ivy` extra, with no Rust toolchain on PATH and
outside the clone. `tulip-rose serve` from that virtualenv must find its
Ivy there, serve the embedded default model and a model directory with
vectors that match sentence-transformers, stop on SIGTERM leaving no
process of its children's groups behind, and exit 1 naming a child that
was killed.

Third-party packages (torch, the embedded model, ...) are not downloaded
again: the fresh virtualenv sees this one's site-packages through a .pth
file, after its own, so the `tulip`, `rose` and `tulip_rose_cli` it imports
are the wheel's (checked). The wheels are built once for the module, in
the cargo target folder the rest of the build uses, so after `make
install` only the packaging runs."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench.harness import tiny_models as models
from bench.harness.fixtures import corpus_lines
from tests.cli.serve_process import Serve, alive
from tests.support.servers import REPO
from tests.support.vectors import cosines

# The first test also builds the wheels: a cold cargo target folder takes
# far longer than a test (after `make install` it is the packaging only).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

TEXTS = corpus_lines("botchan.txt")[200:216] + corpus_lines("calibration_miracl.txt")[8:16]
# No cargo, rustc or rustup here: the user's PATH without a Rust toolchain.
PATH = "/usr/bin:/bin"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    build = subprocess.run([REPO / "packaging" / "wheels.sh", out], cwd=REPO, capture_output=True, text=True,
                           env={**os.environ, "PYTHON": sys.executable})
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    found = {p.name.split("-")[0]: p for p in out.glob("*.whl")}
    assert set(found) == {"tulip_rose", "tulip_rose_ivy"}, sorted(out.iterdir())
    return found


@pytest.fixture(scope="module")
def venv(wheels, tmp_path_factory) -> Path:
    """A fresh virtualenv with both wheels installed through the extra."""
    root = tmp_path_factory.mktemp("user") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", root], check=True)
    site = subprocess.run([root / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True).stdout.strip()
    # This environment's site-packages (torch, the default model, ...), after
    # the fresh one's own; the .pth files inside them are not read, so this
    # checkout's editable install stays out. The base environment first: a
    # virtualenv layered over another (a worktree's over the main one) holds
    # little but an old setuptools of its own, which must not hide the base's.
    ours = [p for p in reversed(sys.path) if p.endswith("-packages") and os.path.isdir(p)]
    (Path(site) / "_project_site_packages.pth").write_text("\n".join(ours) + "\n")
    # `[ivy]` pulls tulip-rose-ivy from the wheel folder; everything else is
    # already satisfied through the .pth, so nothing is downloaded.
    install = subprocess.run([sys.executable, "-m", "pip", "--python", root / "bin" / "python", "install", "-q",
                              "--no-index", "--find-links", wheels["tulip_rose"].parent,
                              f"{wheels['tulip_rose']}[ivy]"], capture_output=True, text=True)
    assert install.returncode == 0, install.stderr[-4000:]
    return root


@pytest.fixture(scope="module")
def user_env(venv) -> dict[str, str]:
    """A user's environment: the fresh virtualenv first on a PATH with no
    Rust toolchain, nothing pointing into the clone."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CARGO", "RUSTUP", "IVY_", "TULIP_", "PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = f"{venv / 'bin'}:{PATH}"
    for tool in ("cargo", "rustc", "rustup", "maturin"):
        assert shutil.which(tool, path=env["PATH"]) is None, tool
    return env


def test_the_installed_packages_are_the_wheels(venv, user_env, tmp_path):
    code = "import rose, tulip, tulip._native, tulip_rose_cli; print(tulip._native.__file__, rose.__file__)"
    out = subprocess.run([venv / "bin" / "python", "-c", code], cwd=tmp_path, env=user_env, capture_output=True,
                         text=True, check=True).stdout.split()
    site = venv / "lib"
    assert all(Path(p).is_relative_to(site) for p in out), out
    ivy = venv / "bin" / "ivy"
    assert os.access(ivy, os.X_OK)
    # Stripped in the wheel: no symbol table, no debug info.
    sections = subprocess.run(["readelf", "-S", "-W", ivy], capture_output=True, text=True, check=True).stdout
    assert ".symtab" not in sections and ".debug_info" not in sections


def test_default_model_then_sigterm_leaves_nothing(venv, user_env, tmp_path, st_minilm, log_dir):
    s = Serve(log_dir=log_dir, command=[str(venv / "bin" / "tulip-rose")], cwd=tmp_path, base_env=user_env)
    try:
        s.wait_ready()
        assert f"Ivy ({venv / 'bin' / 'ivy'})" in s.log()
        want = st_minilm.encode(TEXTS, normalize_embeddings=True)
        assert cosines(s.embed(TEXTS), want).min() >= 0.999

        pids = s.child_pids()
        assert set(pids) == {"tulip-0", "ivy"}
        s.proc.send_signal(signal.SIGTERM)
        assert s.wait() == 0, s.log()[-4000:]
        assert not s.left_behind() and not any(alive(p) for p in pids.values())
    finally:
        if s.proc.poll() is None or s.left_behind():
            s.kill_all()


def test_model_directory_then_a_killed_child_fails_the_command(venv, user_env, tmp_path, log_dir):
    from sentence_transformers import SentenceTransformer

    model_dir = models.tiny_bert(tmp_path / "tiny-bert", seed=11)
    s = Serve("--model", str(model_dir), log_dir=log_dir, command=[str(venv / "bin" / "tulip-rose")],
              cwd=tmp_path, base_env=user_env)
    try:
        s.wait_ready()
        want = SentenceTransformer(str(model_dir), device="cpu").encode(TEXTS, normalize_embeddings=True)
        assert cosines(s.embed(TEXTS), want).min() >= 0.999

        pids = s.child_pids()
        os.kill(pids["tulip-0"], signal.SIGKILL)
        assert s.wait() == 1, s.log()[-4000:]
        assert f"tulip-0 (pid {pids['tulip-0']}) was killed by SIGKILL; stopping the others" in s.log()
        assert not s.left_behind() and not any(alive(p) for p in pids.values())
    finally:
        if s.proc.poll() is None or s.left_behind():
            s.kill_all()
