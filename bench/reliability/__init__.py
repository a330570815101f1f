"""``python -m bench reliability [--quick|--full]``: soak, overload, chaos
during a bulk job and protocol fuzzing against Ivy and two Tulip replicas
(the embedded all-MiniLM-L6-v2) run as real processes, plus a tiny seeded
cross-encoder behind its own Ivy for the soak's rerank traffic. Writes
``reliability.json``/``.md``/``.png``; every figure is listed next to its
target (issue 16)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from bench.harness.results import REPO, Writer, now

TITLE = "Reliability: soak, overload, chaos during a bulk job, fuzzing"


@dataclass(frozen=True)
class Mode:
    soak_s: float
    soak_rate: float
    soak_warmup_s: float
    soak_window_s: float
    overload_s: float
    overload_at_limit_s: float
    chaos_docs: int
    chaos_every_s: float
    http_examples: int  # per operation and generation mode (positive, negative)
    grpc_calls: int  # per service
    tokenizer_fuzz_s: float  # 0: not run


MODES = {
    "quick": Mode(soak_s=180, soak_rate=3, soak_warmup_s=30, soak_window_s=45, overload_s=15,
                  overload_at_limit_s=8, chaos_docs=3000, chaos_every_s=5, http_examples=100,
                  grpc_calls=2000, tokenizer_fuzz_s=0),
    "full": Mode(soak_s=1800, soak_rate=3, soak_warmup_s=180, soak_window_s=300, overload_s=60,
                 overload_at_limit_s=30, chaos_docs=20000, chaos_every_s=20, http_examples=500,
                 grpc_calls=20000, tokenizer_fuzz_s=600),
}
SECTIONS = ("soak", "overload", "chaos", "fuzz_http", "fuzz_grpc", "tokenizer_fuzz")
OVERLOAD_LIMIT = 4  # Ivy's --max-concurrent-requests in the overload section
TULIP_THREADS = 1  # two replicas on a 2-core machine
# Tulip flags as served by default (the launcher's Tulip turns both off).
SERVED_DEFAULTS = {"cpu_fast_path": "true", "cpu_bf16": "auto"}


class Servers:
    """Two MiniLM replicas behind Ivy; a cross-encoder replica behind a
    second Ivy (for rerank traffic), started on first use."""

    def __init__(self, log_dir: Path):
        from tulip_rose_cli.launch import Ivy, default_model_dir, start_tulips

        self.log_dir = log_dir
        self.model_dir = default_model_dir()
        # As served by default: the CPU fast path and the bfloat16 twin
        # (auto: where the CPU has AMX), built lazily during the warm-up (so
        # the soak's memory figures include them).
        self.replicas = start_tulips(2, self.model_dir, log_dir=log_dir, threads=TULIP_THREADS, **SERVED_DEFAULTS)
        self.ivy = Ivy([t.url for t in self.replicas], self.model_dir, log_dir=log_dir)
        self._rerank = None
        self._model_tmp: str | None = None
        with self.replicas[0].client() as c:
            self.vocab = c.info().vocab_size

    def tulip_args(self) -> dict:
        return {"log_dir": self.log_dir, "threads": TULIP_THREADS, **SERVED_DEFAULTS}

    def rerank(self):
        """(Ivy, Tulip) on a tiny seeded BERT cross-encoder (as the tests
        build it): MiniLM has no score head, so its /rerank is a 424."""
        if self._rerank is None:
            from bench.harness import tiny_models as models
            from tulip_rose_cli.launch import Ivy, Tulip

            self._model_tmp = tempfile.mkdtemp(prefix="rel-rerank-")
            model = models.tiny_reranker(Path(self._model_tmp) / "model", arch="bert")
            tulip = Tulip(str(model), **self.tulip_args())
            self._rerank = (Ivy([tulip.url], str(model), log_dir=self.log_dir), tulip)
        return self._rerank

    def pids(self) -> dict[str, int]:
        out = {"ivy": self.ivy.proc.pid, **{f"tulip{i}": t.proc.pid for i, t in enumerate(self.replicas)}}
        if self._rerank:
            out["ivy_rerank"], out["tulip_rerank"] = self._rerank[0].proc.pid, self._rerank[1].proc.pid
        return out

    def close(self) -> None:
        procs = [self.ivy, *(self._rerank or ()), *self.replicas]
        for p in procs:
            p.stop()
        if self._model_tmp:
            shutil.rmtree(self._model_tmp, ignore_errors=True)


def run_soak(servers: Servers, mode: Mode) -> dict:
    from bench.reliability import soak as soak_mod
    from bench.reliability import traffic

    rerank_ivy, _ = servers.rerank()
    kinds = traffic.kinds(servers.model_dir, servers.ivy.port, rerank_ivy.port, servers.vocab, max_inputs=2048)
    return soak_mod.run(kinds, {"embed": servers.ivy.port, "rerank": rerank_ivy.port}, servers.pids,
                        seconds=mode.soak_s, rate=mode.soak_rate, warmup=mode.soak_warmup_s,
                        window=mode.soak_window_s)


def run_overload(servers: Servers, mode: Mode) -> dict:
    from bench.reliability import overload as overload_mod
    from tulip_rose_cli.launch import Ivy

    ivy = Ivy([t.url for t in servers.replicas], servers.model_dir, log_dir=servers.log_dir,
              max_concurrent_requests=OVERLOAD_LIMIT)
    try:
        return overload_mod.run(ivy, OVERLOAD_LIMIT, seconds=mode.overload_s,
                                at_limit_seconds=mode.overload_at_limit_s)
    finally:
        ivy.stop()


def run_chaos(servers: Servers, mode: Mode) -> dict:
    from bench.reliability import chaos as chaos_mod

    return chaos_mod.run(servers.ivy, servers.replicas, docs=mode.chaos_docs, every=mode.chaos_every_s,
                         **servers.tulip_args())


def run_fuzz_http(servers: Servers, mode: Mode) -> dict:
    from bench.reliability import fuzz_http as fuzz

    return fuzz.run(servers.ivy.url, mode.http_examples, alive=servers.ivy.alive)


def run_fuzz_grpc(servers: Servers, mode: Mode) -> dict:
    from bench.reliability import fuzz_grpc as fuzz
    from tulip.client import load_stubs

    tpb, _ = load_stubs("tulip")
    ipb, _ = load_stubs("ivy")
    tulip = servers.replicas[0]
    good_tulip = ("/tulip.v1.Tulip/Embed", tpb.EmbedRequest(token_ids=[101, 7592, 102], lengths=[3]).SerializeToString())
    good_ivy = ("/ivy.v1.Ivy/Embed", ipb.EmbedRequest(inputs=["still serving"]).SerializeToString())
    return {
        "tulip": fuzz.run(tulip.target, fuzz.tulip_requests(tpb, servers.vocab), mode.grpc_calls, good_tulip,
                          alive=tulip.alive),
        "ivy": fuzz.run(servers.ivy.grpc_target, fuzz.ivy_requests(ipb), mode.grpc_calls, good_ivy,
                        alive=servers.ivy.alive),
    }


TOKENIZER_FUZZ_COMMAND = ("python -m bench.harness.fixtures && cd ivy/tokenizer && "
                          "RUSTC_BOOTSTRAP=1 cargo fuzz run --sanitizer none encode -- -max_total_time=600")


def run_tokenizer_fuzz(servers: Servers | None, mode: Mode) -> dict:
    """The cargo-fuzz target ivy/tokenizer/fuzz (ours vs Hugging Face
    tokenizers on any bytes), for ``mode.tokenizer_fuzz_s`` seconds."""
    if not mode.tokenizer_fuzz_s:
        return {"status": "not run in quick mode", "command": TOKENIZER_FUZZ_COMMAND}
    probe = subprocess.run(["cargo", "fuzz", "--version"], capture_output=True, text=True) \
        if shutil.which("cargo") else None
    if probe is None or probe.returncode != 0:
        return {"status": "not run: cargo-fuzz is not installed (cargo install cargo-fuzz)",
                "command": TOKENIZER_FUZZ_COMMAND}
    subprocess.run([sys.executable, "-m", "bench.harness.fixtures"], cwd=REPO, check=False)
    seconds = int(mode.tokenizer_fuzz_s)
    started = time.monotonic()
    out = subprocess.run(["cargo", "fuzz", "run", "--sanitizer", "none", "encode", "--",
                          f"-max_total_time={seconds}"], cwd=REPO / "ivy" / "tokenizer",
                         env={**os.environ, "RUSTC_BOOTSTRAP": "1"},
                         capture_output=True, text=True)
    return {"status": "ran", "exit_code": out.returncode, "seconds": round(time.monotonic() - started),
            "command": TOKENIZER_FUZZ_COMMAND.replace("600", str(seconds)), "tail": out.stderr[-2000:]}


RUNNERS = {"soak": run_soak, "overload": run_overload, "chaos": run_chaos, "fuzz_http": run_fuzz_http,
           "fuzz_grpc": run_fuzz_grpc, "tokenizer_fuzz": run_tokenizer_fuzz}


def earlier_results(path: Path, mode_name: str) -> dict | None:
    import json

    try:
        earlier = json.loads(path.read_text())["results"]
    except (OSError, ValueError, KeyError):
        return None
    return earlier if earlier.get("mode") == mode_name else None


def run_suite(writer: Writer, mode_name: str, only: list[str] | None = None) -> Path:
    """Runs the sections (fuzzing first: cheapest, and the chaos section
    restarts the replicas), each isolated: one that fails is recorded with
    its error and the others still run."""
    from bench.reliability import report

    mode = MODES[mode_name]
    started = now()
    log_dir = Path(tempfile.mkdtemp(prefix="reliability-logs-"))
    order = ["fuzz_http", "fuzz_grpc", "soak", "overload", "chaos", "tokenizer_fuzz"]
    sections = [s for s in order if not only or s in only]
    results: dict = {"mode": mode_name, "params": mode.__dict__, "log_dir": str(log_dir)}
    if only:
        # A partial run adds its sections to an earlier run's report of the
        # same mode in the same folder (each run is listed under "runs").
        results = earlier_results(writer.out_dir / "reliability.json", mode_name) or results
    results.setdefault("runs", []).append({"sections": sections, "started": started,
                                           "command": " ".join(writer.command),
                                           "loadavg_at_start": os.getloadavg()[0]})
    servers = Servers(log_dir)
    try:
        for name in sections:
            t = time.monotonic()
            print(f"[reliability] {name} …", flush=True)
            try:
                results[name] = RUNNERS[name](servers, mode)
            except Exception as e:
                results[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
            results[name]["section_s"] = round(time.monotonic() - t, 1)
    finally:
        servers.close()
    try:
        figure = report.plot(results, writer.out_dir / "reliability.png")
    except Exception as e:  # the figures must not be lost with the picture
        results["plot_error"] = f"{type(e).__name__}: {e}"
        figure = None
    md = report.markdown(results, figure)
    return writer.write("reliability", TITLE, results, md, [], started)
