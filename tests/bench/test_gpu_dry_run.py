"""The GPU script's dry run on the CPU: the preflight, the incremental
writing of gpu.json/gpu.md, and the isolation of sections (a forced failure
in one leaves the others' results; a forced crash keeps everything written
before it). Runs with the stubs built from a descriptor set, as on the GPU
machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tulip.client import write_descriptors

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def descriptors(tmp_path_factory) -> Path:
    return write_descriptors(tmp_path_factory.mktemp("protos") / "protos.desc")


def dry_run(out: Path, descriptors: Path, *flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TULIP_PROTO_DESCRIPTORS": str(descriptors), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "bench.gpu.run", "--dry-run", "--out", str(out), *flags],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_a_failed_section_keeps_the_others_and_a_crash_keeps_what_was_written(tmp_path, descriptors):
    # A carried binary that does not run here (/bin/false) is left out by
    # the preflight, and its chart falls back to the Python client.
    res = dry_run(tmp_path, descriptors, "--only", "gate/minilm,check/*,minilm/online,minilm/scoring",
                  "--fail-section", "check/event_wait,minilm/scoring=exit", "--loadgen", "/bin/false")
    log = res.stdout[-3000:] + res.stderr[-3000:]
    assert res.returncode == 3, log  # the forced crash, in the last section
    out = json.loads((tmp_path / "gpu.json").read_text())
    sections = out["sections"]
    assert out["preflight"]["passed"], log
    assert [n for n in sections if n.startswith("preflight/")] == [
        "preflight/versions", "preflight/extension", "preflight/stubs", "preflight/event_wait",
        "preflight/binaries", "preflight/tulip"]
    assert sections["preflight/stubs"]["result"]["source"] == "descriptor set"
    # The forced raise is recorded, and the sections around it ran.
    assert sections["check/event_wait"]["status"] == "error"
    assert "forced failure" in sections["check/event_wait"]["error"]
    assert sections["gate/minilm"]["status"] == "ok"
    assert all(r["status"] == "passed" for r in sections["gate/minilm"]["result"])
    assert sections["check/graph_replay/minilm"]["status"] == "ok"
    assert sections["minilm/online"]["status"] == "ok", sections["minilm/online"]
    assert set(sections["minilm/online"]["result"]) == {"16", "64", "128"}
    assert sections["preflight/binaries"]["result"]["loadgen"]["runs"] is False
    assert "loadgen floor" not in sections["minilm/online"]["result"]["16"]
    # The crash came before scoring recorded anything; all above survived.
    assert "minilm/scoring" not in sections
    assert "passed" not in out  # the run never finished
    # The crash took down the Tulip serving the charts with it.
    assert not [p for p in Path("/proc").iterdir() if p.name.isdigit() and out["work_dir"] in _cmdline(p)]
    md = (tmp_path / "gpu.md").read_text()
    assert "| check/event_wait | error |" in md and "## minilm/online" in md


def test_a_failed_preflight_stops_the_run_with_a_message(tmp_path, descriptors):
    res = dry_run(tmp_path, descriptors, "--fail-section", "preflight/stubs")
    assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
    assert "PREFLIGHT FAILED at stubs" in res.stderr
    out = json.loads((tmp_path / "gpu.json").read_text())
    assert out["preflight"] == {"passed": False, "step": "stubs",
                                "error": "ForcedFailure: preflight/stubs: forced failure (--fail-section)"}
    assert list(out["sections"]) == ["preflight/versions", "preflight/extension", "preflight/stubs"]
    assert "Preflight failed at stubs" in (tmp_path / "gpu.md").read_text()


def test_the_watchdog_ends_an_overlong_run_and_says_where(tmp_path, descriptors):
    # The preflight alone (a model build and a server start) outlasts 2 s.
    res = dry_run(tmp_path, descriptors, "--hard-limit", "2")
    assert res.returncode == 124, res.stdout[-2000:] + res.stderr[-2000:]
    out = json.loads((tmp_path / "gpu.json").read_text())
    assert out["watchdog"]["after_s"] == 2.0
    assert out["watchdog"]["section"].startswith("preflight/")
    assert "Stopped by the watchdog" in (tmp_path / "gpu.md").read_text()
    # No server it started outlives it (their command lines name its work dir).
    work = out["work_dir"]
    alive = [p for p in Path("/proc").iterdir() if p.name.isdigit() and work in _cmdline(p)]
    assert not alive, [_cmdline(p) for p in alive]


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:  # gone meanwhile
        return ""


def test_graph_configurations_fall_in_the_buckets_of_the_charts_batches():
    from bench.gpu.sizes import Sizes, graph_configurations
    from rose.step.graphs import GraphKey, GraphSettings

    settings, sizes = GraphSettings(), Sizes(dry=False)
    configs = graph_configurations(sizes)
    # The engine captures "NxT" in the bucket of T - 1 real tokens: that must
    # be the bucket a batch of N sequences of L tokens falls in.
    assert set(configs["overlap-off"]) <= set(configs["serving"])  # the serving Tulip is overlap's "on"
    for text in configs["serving"]:
        key = GraphKey.parse(text)
        assert settings.bucket(key.tokens - 1) is not None, text
    assert "1x129" in configs["serving"] and "1x4097" in configs["serving"]
    assert settings.bucket(4096) == settings.bucket(GraphKey.parse("1x4097").tokens - 1)
    assert "8x1025" in configs["overlap-off"]
    assert all(GraphKey.parse(c).tokens - 1 < settings.max_tokens for c in configs["serving"])


def test_the_captured_configurations_run_on_the_static_path(tmp_path):
    """What Tulip's --capture does with the list, on the CPU's static path
    (same dispatcher and buckets, no graph): every configuration the
    model's length allows is accepted and warmed up then captured."""
    from bench.gpu.sizes import Sizes, fitting, graph_configurations
    from bench.harness.tiny_models import tiny_bert
    from rose import Engine
    from rose.step.graphs import GraphSettings, State

    bert_dir = tiny_bert(tmp_path / "bert")
    configs = graph_configurations(Sizes(dry=False))["serving"]
    fit = fitting(configs, 512)  # tiny_bert's limit
    assert "1x129" in fit and "1x4097" not in fit and "8x1025" in fit
    e = Engine.from_dir(bert_dir, device="cpu", static_on_cpu=True, graph_settings=GraphSettings())
    e.capture(fit)
    assert e.runner.dispatcher.counts()[State.CAPTURED.value] == len(fit)


def test_the_gate_in_a_half_dtype_is_held_to_what_the_dtype_allows(tmp_path):
    """transformers' own bf16 forward sets the bar in bf16, capped at
    0.999 and never below 0.99; in float32 the bar is 0.999."""
    from bench.gpu import checks, models

    shape = models.tiny(models.SHAPES["minilm"])
    hf = models.build(shape, tmp_path / "m", "cpu")
    seqs = [models.token_ids(shape, n, seed=n) for n in (5, 17)]
    want = models.reference(hf, shape, seqs)
    assert checks.dtype_floor(hf, shape, seqs, want, "float32") is None
    floor = checks.dtype_floor(hf, shape, seqs, want, "bfloat16")
    assert 0.9 < floor < 1.0  # bf16 rounding is visible, and small
    for given, bar in ((None, 0.999), (0.5, 0.99), (0.995, 0.995), (0.99999, 0.999)):
        records = checks.gate(shape, tmp_path / "m", want, seqs, "cpu", "float32", given)
        assert {r["threshold"] for r in records} == {bar}, given
        assert all(r["status"] == "passed" for r in records)
