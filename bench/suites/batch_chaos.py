"""Issue 47's chaos check: one 20,000-line batch through the OpenAI Batch
API while its processes are killed (SIGKILL) and restarted on their ports,
in a seeded order: two Ivy processes sharing one store (``--batch-dir``) in
front of two Tulip replicas. The batch must complete with every
``custom_id`` exactly once in its output, every line answered 200, and the
vectors equal to ``/v1/embeddings`` for the same text (a sample)."""

from __future__ import annotations

import json
import random
import signal
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.harness import inputs, plots
from bench.harness.results import table
from bench.harness.stack import Stack
from tulip_rose_cli.launch import Ivy, Tulip

TITLE = "Batch API under chaos: a 20,000-line batch while Ivy and Tulip processes are killed and restarted"


def run(stack: Stack, lines: int = 20_000, every_s: float = 6.0, seed: int = 47) -> tuple[dict, str]:
    import openai

    rng = random.Random(seed)
    src = inputs.english_lines()
    work = Path(tempfile.mkdtemp(prefix="bench-batch-chaos-"))
    log_dir = stack.log_dir
    tulips = [Tulip(stack.model_dir, log_dir=log_dir, threads=1) for _ in range(2)]
    tulip_ports = [t.port for t in tulips]

    def ivy(port: int | None = None) -> Ivy:
        return Ivy([f"http://127.0.0.1:{p}" for p in tulip_ports], stack.model_dir, port=port, log_dir=log_dir,
                   batch_dir=str(work / "store"), batch_lease=3, batch_max_lines=lines,
                   batch_max_file_bytes=1 << 30)

    ivys = [ivy(), ivy()]
    events: list[dict] = []
    started = time.monotonic()
    try:
        text = "".join(json.dumps({"custom_id": f"c{i}", "method": "POST", "url": "/v1/embeddings",
                                   "body": {"input": src[i % len(src)]}}) + "\n" for i in range(lines))
        client = openai.OpenAI(base_url=ivys[0].url + "/v1", api_key="unused", max_retries=5)
        f = client.files.create(file=("chaos.jsonl", text.encode()), purpose="batch")
        b = client.batches.create(input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h")
        next_kill = time.monotonic() + every_s
        while True:
            alive = next(i for i in ivys if i.alive())
            try:
                b = openai.OpenAI(base_url=alive.url + "/v1", api_key="unused", max_retries=2).batches.retrieve(b.id)
            except openai.APIConnectionError:
                time.sleep(0.2)
                continue
            if b.status in ("completed", "failed", "expired", "cancelled"):
                break
            if time.monotonic() >= next_kill:
                kind = rng.choice(["ivy", "ivy", "tulip"])
                k = rng.randrange(2)
                done_before = b.request_counts.completed
                if kind == "ivy":
                    ivys[k].signal(signal.SIGKILL)
                    ivys[k].kill()
                    ivys[k] = ivy(ivys[k].port)
                else:
                    tulips[k].signal(signal.SIGKILL)
                    tulips[k].kill()
                    tulips[k] = Tulip(stack.model_dir, port=tulip_ports[k], log_dir=log_dir, threads=1)
                events.append({"t_s": round(time.monotonic() - started, 1), "killed": f"{kind}-{k}",
                               "completed_before": done_before})
                print(f"{events[-1]}", flush=True)
                next_kill = time.monotonic() + every_s
            time.sleep(0.5)
        wall = time.monotonic() - started
        alive = next(i for i in ivys if i.alive())
        c = openai.OpenAI(base_url=alive.url + "/v1", api_key="unused")
        rows = [json.loads(x) for x in c.files.content(b.output_file_id).text.splitlines()] \
            if b.output_file_id else []
        errors = [json.loads(x) for x in c.files.content(b.error_file_id).text.splitlines()] \
            if b.error_file_id else []
        ids = [r["custom_id"] for r in rows]
        sample = rng.sample(range(lines), 32)
        by_id = {r["custom_id"]: r for r in rows}
        direct = c.embeddings.create(model=rows[0]["response"]["body"]["model"],
                                     input=[src[i % len(src)] for i in sample])
        got = np.asarray([by_id[f"c{i}"]["response"]["body"]["data"][0]["embedding"] for i in sample])
        want = np.asarray([d.embedding for d in direct.data])
        cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    finally:
        for p in [*ivys, *tulips]:
            p.stop()
    missing = lines - len(set(ids))
    repeated = len(ids) - len(set(ids))
    data = {
        "params": {"lines": lines, "kill_every_s": every_s, "seed": seed, "ivys": 2, "tulips": 2,
                   "batch_lease_s": 3, "tulip_threads": 1},
        "status": b.status, "request_counts": b.request_counts.model_dump(), "wall_s": round(wall, 1),
        "kills": events, "output_lines": len(ids), "missing": missing, "repeated": repeated,
        "error_lines": len(errors), "all_200": all(r["response"]["status_code"] == 200 for r in rows),
        "sample_min_cosine_vs_embeddings": float(cos.min()),
        "passed": b.status == "completed" and missing == 0 and repeated == 0 and not errors,
    }
    md = "\n".join([
        f"{lines:,} lines (botchan.txt's body, one document each), two Ivy processes sharing one `--batch-dir` "
        f"(`--batch-lease 3`) in front of two Tulip replicas (1 thread each). Every {every_s:.0f} s one process "
        f"(seeded choice, Ivy twice as often as Tulip) is killed with SIGKILL and restarted on its port.\n",
        table(["t (s)", "killed", "lines completed before"],
              [[e["t_s"], e["killed"], e["completed_before"]] for e in events]),
        f"\nStatus **{b.status}** after {wall:.1f} s; output lines {len(ids):,}, missing {missing}, repeated "
        f"{repeated}, error lines {len(errors)}; every line 200: {data['all_200']}; 32 sampled vectors against "
        f"`/v1/embeddings`, min cosine {cos.min():.6f}. **{'Passed' if data['passed'] else 'Failed'}.**",
    ])
    return data, md


def options(scale: float) -> dict:
    return {"lines": max(500, int(20_000 * scale))}


def plot(data: dict, path: Path) -> Path:
    """Lines completed over time, each kill marked where it happened."""
    plt = plots._plt()
    fig, ax = plt.subplots(figsize=(7, 4))
    kills = data["kills"]
    ts = [0.0] + [k["t_s"] for k in kills] + [data["wall_s"]]
    done = [0] + [k["completed_before"] for k in kills] + [data["request_counts"]["completed"]]
    ax.plot(ts, done, "o-", color="C0", label="lines completed")
    for k in kills:
        ax.axvline(k["t_s"], color="C3" if k["killed"].startswith("tulip") else "C1", alpha=0.5, ls=":")
        ax.annotate(k["killed"], (k["t_s"], k["completed_before"]), fontsize=7, rotation=90,
                    xytext=(3, 5), textcoords="offset points")
    return plots.finish(plt, fig, ax, path, "seconds since the batch was created", "lines completed",
                        f"Batch API under chaos: {data['params']['lines']:,} lines, {len(kills)} SIGKILLs")
