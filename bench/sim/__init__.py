"""``python -m bench sim [--quick]``: GPU-speed figures on any machine, from
the simulated device (``docs/simulated-device.md``): Tulip's and Ivy's real
host path, the device modelled as BGE-M3 on one H200.

Sections: online (batch 1 at 128 / 512 / 4,096 tokens through Tulip's gRPC
pre-tokenized and through Ivy with text: what the host path adds over the
modelled device time), saturation (4 clients x 100 x 512: the device's busy
fraction with two steps in flight and with one), fan-out (one Ivy over 1, 2,
4, 8 replicas), the four published charts at simulated speed beside the
published Tulip and vLLM figures. Results: ``sim.md``, ``sim.json``,
``sim.png`` in the results folder.

Isolation (queries under indexing, ``bench/suites/isolation.py``) runs on both
cost models, ``roofline`` and ``published``, into
``sim-isolation-<model>.{md,json,png}``; ``--only isolation`` runs only it
(``--only isolation:published`` one model).

Late chunking's throughput (issue 46, ``bench/sim/late_chunking.py``) runs
only when asked: ``--only late-chunking``, into ``sim-late-chunking.{md,json}``."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

from bench.harness.results import now
from bench.sim import host, latency, load, report
from bench.sim.replicas import LAUNCH_US, Fleet, bge_m3_dir
from rose.sim import DEFAULT_COST
from rose.sim.cost import MODELS

TITLE = "Simulated device: the host path at GPU speed (BGE-M3 on one H200, modelled)"


class Sizes:
    def __init__(self, quick: bool):
        self.quick = quick
        self.lengths = [128, 512, 4096]
        self.rounds = 12 if quick else 300
        self.host_requests = 200 if quick else 3000
        self.host_profile_s = 2.0 if quick else 8.0
        self.score_batches = [5, 25, 50]
        self.score_rounds = 3 if quick else 40
        self.sat = dict(length=512, batch=100, clients=4, requests=1 if quick else 6, rounds=1 if quick else 2)
        self.fanout = [1, 2] if quick else [1, 2, 4, 8]
        # Quick: enough requests that Ivy uses several 10 ms CPU ticks (the
        # per-process meter reads /proc ticks; 6 once read as 0 in CI).
        self.fan_requests = 40 if quick else 120
        self.conc_levels = [1, 4] if quick else [1, 2, 4, 8, 16]
        self.conc_per_level = 8 if quick else 200
        # Issue 42: >= 2,000 queries per scenario over >= 3 rounds: 3 x 7 s
        # at 100 queries/s.
        self.iso = dict(rounds=1 if quick else 3, seconds=3.0 if quick else 7.0, query_rate=100.0,
                        bulk_docs=4000 if quick else 16000)


ISOLATION_TITLE = "Isolation at GPU speed: query latency under indexing on the simulated device"


def run_isolation(writer, sizes: Sizes, model_dir: Path, work: Path, costs: list[str]) -> dict:
    """The isolation section on each cost model, a file set per model."""
    from bench.sim import load as sim_load

    files = {}
    for cost in costs:
        started = now()
        print(f"sim: isolation, {cost} cost model", flush=True)
        data, md, gates = sim_load.isolation(model_dir, work, cost, **sizes.iso)
        name = f"sim-isolation-{cost}"
        path = writer.write(name, f"{ISOLATION_TITLE} ({cost})", data, md, gates, started)
        from bench.harness import isolation_report

        isolation_report.plot(data, writer.out_dir / f"{name}.png")
        print(path.read_text())
        files[cost] = f"{name}.md"
    return files


def run_suite(writer, args) -> int:
    work = Path(tempfile.mkdtemp(prefix="bench-sim-"))
    try:
        return _run(writer, args, work)
    finally:
        # Device logs, the profilers' raw samples, the model's files: the
        # results folder has what the run found.
        shutil.rmtree(work, ignore_errors=True)


def _run(writer, args, work: Path) -> int:
    sizes = Sizes(args.mode == "quick")
    only = (args.only or "").split(":")
    if only[0] == "isolation":
        model_dir = Path(args.model) if args.model else bge_m3_dir(work)
        run_isolation(writer, sizes, model_dir, work, only[1].split(",") if len(only) > 1 else list(MODELS))
        return 0
    if only[0] == "late-chunking":
        from bench.sim import late_chunking

        model_dir = Path(args.model) if args.model else bge_m3_dir(work)
        from bench.harness.late_chunking_served import LateChunkingUnavailable

        try:
            print(late_chunking.run(writer, sizes.quick, model_dir, work).read_text())
        except LateChunkingUnavailable as e:  # the message, not a traceback
            raise SystemExit(f"sim late-chunking: {e}") from None
        return 0
    if args.only:
        raise SystemExit(f"bench sim --only: isolation[:roofline|published] or late-chunking, got {args.only!r}")
    t_start = time.monotonic()
    started = now()
    load_before = os.getloadavg()
    model_dir = Path(args.model) if args.model else bge_m3_dir(work)
    fleet = Fleet(model_dir, work)
    lg = latency.loadgen()
    data: dict = {"cost_model": {**DEFAULT_COST.to_dict(), "text": DEFAULT_COST.describe()},  # roofline
                  "launch_us": LAUNCH_US, "model_dir": str(model_dir), "quick": sizes.quick,
                  "client": "loadgen (compiled)" if lg else "Python clients (no loadgen built)",
                  "load_average_before": [round(x, 2) for x in load_before]}
    try:
        tulip, log = fleet.tulip("serving")  # GPU defaults: --max-inflight 2, full steps
        ivy = fleet.ivy([tulip], "serving")
        print(f"sim: online ({time.monotonic() - t_start:.0f} s)", flush=True)
        data["online"] = latency.online(tulip, log, ivy, fleet.model_dir, sizes.lengths, sizes.rounds, lg)
        if lg is not None:  # the profile needs the compiled client: a Python one would be most of it
            print(f"sim: host path profile ({time.monotonic() - t_start:.0f} s)", flush=True)
            data["host"] = host.profile(tulip, ivy, log, fleet.model_dir, lg, sizes.host_requests, writer.out_dir,
                                        work, sizes.host_profile_s)
        print(f"sim: scoring ({time.monotonic() - t_start:.0f} s)", flush=True)
        data["scoring"] = latency.scoring(tulip, log, 512, sizes.score_batches, sizes.score_rounds, lg)
        print(f"sim: concurrency ({time.monotonic() - t_start:.0f} s)", flush=True)
        data["concurrency"] = latency.concurrency(ivy, log, fleet.model_dir, 512, sizes.conc_levels,
                                                  sizes.conc_per_level, lg)
        print(f"sim: saturation ({time.monotonic() - t_start:.0f} s)", flush=True)
        off = fleet.tulip("inflight-1", max_inflight=1)
        data["saturation"] = load.saturation({"on": (tulip, log), "off": off}, **sizes.sat)
        fleet.stop(off[0])
        fleet.stop(ivy)
        print(f"sim: fan-out ({time.monotonic() - t_start:.0f} s)", flush=True)
        data["fanout"] = load.fanout(fleet, sizes.fanout, texts_per_request=16, length=256,
                                     requests_per_replica=sizes.fan_requests, clients_per_replica=4, lg=lg,
                                     first=(tulip, log))
    finally:
        fleet.close()
    print(f"sim: isolation ({time.monotonic() - t_start:.0f} s)", flush=True)
    data["isolation"] = run_isolation(writer, sizes, model_dir, work, list(MODELS))
    data["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    md = report.markdown(data)
    path = writer.write("sim", TITLE, data, md, fleet.gates, started)
    report.plot(data, writer.out_dir / "sim.png")
    print(path.read_text())
    return 0
