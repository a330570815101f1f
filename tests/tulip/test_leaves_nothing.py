"""Every start and stop of Tulip leaves the machine as it found it (issue
49), with real processes: the CPU fast path's export goes to the export
cache (rose/cpu/cache.py) and nowhere else, its child process ends with
the server however the server ends (SIGTERM, SIGKILL), a restart loads the
cached export instead of exporting again, and a model ROSE cannot serve
is refused in one line by ``python -m tulip``, ``tulip-rose serve`` and a
Hub id alike."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from bench.harness.tiny_models import tiny_bert
from tests.cli.serve_process import Serve, alive, children_of, in_groups
from tests.support.fake_hub import FakeHub
from tests.support.servers import IVY_BIN, REPO, Tulip, wait_for

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

QUERY = [[101, 2054, 2003, 2019, 7861, 8270, 4667, 1029, 102]]  # "what is an embedding?"


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _export_child(pids) -> int | None:
    """The pid of the export child (``python -m rose.cpu.onnx_export``)
    among ``pids``, if one is running."""
    for pid in pids:
        try:
            if b"rose.cpu.onnx_export" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        except (FileNotFoundError, ProcessLookupError):
            continue
    return None


def _start(model_dir, tmp_path: Path, log_dir: Path, **flags) -> Tulip:
    """A Tulip with the fast path on, its cache in ``tmp_path/cache`` and
    its TMPDIR ``tmp_path/tmp`` (which must stay empty)."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return Tulip(model_dir, log_dir=log_dir, env={"TMPDIR": str(tmp_path / "tmp")}, cpu_fast_path="true",
                 cache_dir=str(tmp_path / "cache"), timeout=300, **flags)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_stopped_during_the_export_leaves_no_process_and_no_file(minilm_dir, tmp_path, log_dir, sig):
    """Tulip stopped (SIGTERM) or killed (SIGKILL) while its export child
    runs: the child ends too, and neither TMPDIR nor the cache keeps a file
    of the unfinished export."""
    tulip = _start(minilm_dir, tmp_path, log_dir)
    try:
        with tulip.client() as c:
            c.embed(QUERY)  # the bucket's first step: its build starts in the background
        child = wait_for(lambda: _export_child(children_of(tulip.pid)), "the export child to start",
                         timeout=120, every=0.05)
        os.kill(tulip.pid, sig)
        tulip.proc.wait(120)
        wait_for(lambda: not alive(child), "the export child to end with its server", timeout=60)
    finally:
        tulip.stop(timeout=5)  # already gone, unless an assertion above failed
    assert _files(tmp_path / "tmp") == set()
    # The unfinished export is gone with its child: no entry, no staging.
    assert _files(tmp_path / "cache") == set()


def test_serve_stopped_during_the_export_exits_once_its_whole_tree_is_gone(tmp_path, log_dir):
    """Ctrl-C on ``tulip-rose serve`` while a replica exports: when serve
    has exited, no process of its children's groups is left, the export
    child included (before issue 49 it ran on, orphaned)."""
    (tmp_path / "tmp").mkdir()
    s = Serve(f"--tulip-arg=--cpu-fast-path=true --cache-dir={tmp_path / 'cache'}", log_dir=log_dir,
              env={"TMPDIR": str(tmp_path / "tmp")})
    try:
        s.wait_ready()
        s.embed(["what is an embedding?"])
        tulip = s.child_pids()["tulip-0"]
        wait_for(lambda: _export_child(in_groups({tulip})), "the export child to start", timeout=120, every=0.05)
        s.proc.send_signal(signal.SIGINT)
        assert s.wait(timeout=120) == 0, s.log()[-4000:]
        assert s.left_behind() == {}, s.log()[-4000:]
    finally:
        s.kill_all()
    assert _files(tmp_path / "tmp") == set()


def test_a_restart_loads_the_cached_export_within_its_bound(tmp_path, log_dir):
    model = tiny_bert(tmp_path / "bert")
    bound = 50 << 20
    flags = dict(cpu_fast_path_warm="true", cpu_fast_path_max_tokens=16, cache_max_bytes=bound)
    first = _start(model, tmp_path, log_dir, **flags)
    first.stop()
    log = first.log()
    assert "CPU fast path: exported into the cache" in log and "reused" not in log, log[-3000:]
    entries = list((tmp_path / "cache").glob("onnx-*"))
    assert len(entries) == 1 and (entries[0] / "model.onnx").is_file()
    assert json.loads((entries[0] / "meta.json").read_text())["max_tokens"] == "16"
    size = sum(p.stat().st_size for p in (tmp_path / "cache").rglob("*") if p.is_file())
    assert 0 < size <= bound

    second = _start(model, tmp_path, log_dir, **flags)
    with second.client() as c:
        c.embed([QUERY[0][:5]])
    steps = second.metrics()
    second.stop()
    log = second.log()
    assert f"CPU fast path: export reused from the cache ({entries[0]})" in log, log[-3000:]
    assert "exported into the cache" not in log
    assert re.search(r'tulip_steps_total\{mode="onnx"\} [1-9]', steps), steps
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [entries[0].name]
    assert _files(tmp_path / "tmp") == set()


# SigLIP 2's NaFlex vision tower is not built: an architecture ROSE refuses.
SIGLIP2 = {"architectures": ["Siglip2Model"], "model_type": "siglip2",
           "text_config": {"model_type": "siglip2_text_model", "hidden_size": 768, "num_attention_heads": 12},
           "vision_config": {"model_type": "siglip2_vision_model", "hidden_size": 768, "num_patches": 256}}
REFUSAL = ("Siglip2Model (model_type 'siglip2'; nested text_config, vision_config) is not supported; "
           "ROSE serves bert, xlm-roberta")


def _one_line_refusal(res: subprocess.CompletedProcess) -> str:
    out = res.stdout + res.stderr
    assert res.returncode == 2, out
    assert "Traceback" not in out, out
    errors = [line for line in out.splitlines() if "ERROR" in line or "cannot" in line]
    assert len(errors) == 1, out
    assert REFUSAL in errors[0], out
    return errors[0]


def test_an_unsupported_model_is_refused_in_one_line(tmp_path):
    model = tmp_path / "siglip2"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(SIGLIP2))
    env = {**os.environ, "PYTHONPATH": str(REPO), "IVY_BIN": str(IVY_BIN)}
    tulip = subprocess.run([sys.executable, "-m", "tulip", "--model", str(model), "--port", "0",
                            "--metrics-port", "0"], cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert str(model) in _one_line_refusal(tulip)
    serve = subprocess.run([sys.executable, "-m", "tulip_rose_cli", "serve", "--model", str(model), "--port", "0"],
                           cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
    assert "tulip-rose serve: cannot serve" in _one_line_refusal(serve)
    assert "started" not in serve.stderr  # refused before any child


def test_an_unsupported_hub_id_is_refused_before_its_weights_are_fetched(tmp_path):
    hub = FakeHub()
    try:
        hub.add("acme/siglip2", {"config.json": json.dumps(SIGLIP2).encode(), "model.safetensors": b"\0" * 4096},
                "c9745ed1d9f207416be6d2e6f8de32d1f16199bf")
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
        env.update(PYTHONPATH=str(REPO), HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="0")
        res = subprocess.run([sys.executable, "-m", "tulip", "--model", "acme/siglip2", "--port", "0",
                              "--metrics-port", "0"], cwd=REPO, capture_output=True, text=True, timeout=120, env=env)
        assert "acme/siglip2@main" in _one_line_refusal(res)
        assert hub.fetched() == ["config.json"]
    finally:
        hub.close()
