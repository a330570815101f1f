"""The simulated replicas a run needs: Tulip processes on ``--device sim``
(each with its own event log), Ivy in front of them, a BGE-M3-shaped model
directory, the correctness gate, and what the logs say about the device."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from bench.harness import gate
from rose.sim import busy_fraction, read_log
from tulip_rose_cli.launch import Ivy, Tulip

# Host microseconds one launch costs, spent busy on the launching thread
# (GIL held): one CUDA graph replay with its two async copies and the event
# record. An assumption, reported next to every result; 0 would claim a
# free launch, an eager BGE-M3 forward (~500 kernel launches) costs ~2-5 ms.
LAUNCH_US = 20.0
BGE_M3_SHAPE = {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
                "intermediate_size": 4096}


def bge_m3_dir(root: Path) -> Path:
    """A model directory with BGE-M3's config (XLM-RoBERTa large: hidden
    1024, 24 layers, 16 heads, vocab 250,002, 8,192 tokens), its tokenizer
    and sentence-transformers files (CLS pooling, normalised), and no
    weights: the simulated device reads none."""
    from transformers import XLMRobertaConfig

    from bench.harness.tiny_models import _sentence_transformers, _tokenizer

    out = root / "bge-m3-sim"
    if (out / "config.json").is_file():
        return out
    out.mkdir(parents=True, exist_ok=True)
    XLMRobertaConfig(vocab_size=250002, max_position_embeddings=8194, type_vocab_size=1, pad_token_id=1,
                     bos_token_id=0, eos_token_id=2, **BGE_M3_SHAPE).to_json_file(str(out / "config.json"))
    _tokenizer(out, "xlm-roberta", model_max_length=8192)
    _sentence_transformers(out, "cls", normalize=True, max_seq_length=8192)
    return out


class Fleet:
    """Every process a run started, stopped together."""

    def __init__(self, model_dir: Path, work: Path, launch_us: float = LAUNCH_US, cost: str = ""):
        self.model_dir = str(model_dir)
        self.work = work
        self.launch_us = launch_us
        self.cost = cost
        self.procs: list = []
        self.gates: list[dict] = []
        self._n = 0

    def tulip(self, name: str, **flags) -> tuple[Tulip, Path]:
        self._n += 1
        log = self.work / f"{self._n:02d}-{name}.jsonl"
        t = Tulip(self.model_dir, log_dir=self.work / "logs", device="sim", sim_log=str(log),
                  sim_launch_us=self.launch_us, sim_cost=self.cost, **flags)
        self.procs.append(t)
        self._gate_tulip(t, name)
        return t, log

    def ivy(self, tulips: list[Tulip], name: str, **flags) -> Ivy:
        ivy = Ivy([t.url for t in tulips], self.model_dir, log_dir=self.work / "logs", **flags)
        self.procs.append(ivy)
        self._gate_ivy(ivy, name)
        return ivy

    def stop(self, proc) -> None:
        proc.stop()
        if proc in self.procs:
            self.procs.remove(proc)

    def close(self) -> None:
        for p in reversed(self.procs):
            p.stop()
        self.procs.clear()

    # The gate: served rows equal the simulated device's own (in-process)
    # outputs, so every timed server is known to return each request's rows.

    def reference(self, seqs: list[list[int]]) -> np.ndarray:
        if not hasattr(self, "_engine"):
            from rose.sim import SimEngine, SimSettings

            self._engine = SimEngine.from_dir(self.model_dir, settings=SimSettings.from_flags(cost="0,0,0"))
        return self._engine.embed(seqs).numpy()

    def _gate_tulip(self, t: Tulip, name: str) -> None:
        rng = np.random.default_rng(7)
        seqs = [[0, *map(int, rng.integers(5, 250000, size=n)), 2] for n in (3, 30, 300, 3)]
        with t.client() as c:
            got = c.embed(seqs).values
        self.gates.append(gate.check(f"Tulip sim ({name})", got, self.reference(seqs), "rose.sim in-process"))

    def _gate_ivy(self, ivy: Ivy, name: str) -> None:
        from bench.harness import inputs
        from bench.harness.httpclient import HttpClient
        from bench.harness.stack import IVY_PATH, http_embeddings

        texts = inputs.english_lines()[:8]
        with HttpClient("127.0.0.1", ivy.port) as c:
            got = http_embeddings(c, IVY_PATH, texts)
        ids = [inputs.ids(self.model_dir, t) for t in texts]
        self.gates.append(gate.check(f"Ivy → Tulip sim ({name})", got, self.reference(ids), "rose.sim in-process"))


def window(log: Path, since_ns: int, until_ns: int) -> list[dict]:
    """The steps launched in ``[since, until]``."""
    return [s for s in read_log(log) if since_ns <= s["launch"] <= until_ns]


def device_ms(steps: list[dict]) -> float:
    """Median modelled device time of these steps, ms."""
    d = sorted(s["end"] - s["start"] for s in steps)
    return d[len(d) // 2] / 1e6 if d else 0.0


def busy(log: Path, since_ns: int, until_ns: int) -> float:
    return busy_fraction(read_log(log), since_ns, until_ns)


def now_ns() -> int:
    return time.monotonic_ns()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
