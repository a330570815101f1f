"""reliability.md: every figure next to its target (issue 16), and one
PNG of RSS and p99 over the soak and Ivy's RSS during the overload."""

from __future__ import annotations

from pathlib import Path

from bench.harness.results import table


def _met(ok) -> str:
    return "–" if ok is None else ("met" if ok else "**missed**")


def checks(r: dict) -> list[list]:
    """[section, figure, value, target, met] rows."""
    rows: list[list] = []

    def add(section, figure, value, target, ok):
        rows.append([section, figure, value, target, _met(ok)])

    if "soak" in r and "error" not in r["soak"]:
        s = r["soak"]
        add("soak", "requests sent (all kinds)", s["requests"], "", None)
        add("soak", "unexpected statuses (bad requests must get their 4xx, the rest 200)",
            s["unexpected_total"], "0", s["unexpected_total"] == 0)
        for name, g in s["rss"].items():
            add("soak", f"RSS growth after warm-up, {name} ({g['base_mib']} → {g['end_mib']} MiB, peak {g['peak_mib']})",
                f"{100 * g['growth']:.1f} %", "≤ 5 %", g["growth"] <= 0.05)
        for kind, w in s["p99_windows"].items():
            if kind in ("all", "query", "batch100"):
                add("soak", f"p99 {kind}: last window / first window after warm-up "
                    f"({w['first_p99_ms']} → {w['last_p99_ms']} ms)", w["ratio"], "≤ 1.5",
                    None if w["ratio"] is None else w["ratio"] <= 1.5)
    if "overload" in r and "error" not in r["overload"]:
        o = r["overload"]
        ov, lim = o["overload"], o["at_limit"]
        add("overload", f"requests with {o['params']['clients']} clients, limit {o['params']['limit']}: statuses",
            ", ".join(f"{k}: {v}" for k, v in ov["statuses"].items()), "200 or 429 only", ov["failed"] == 0)
        add("overload", f"p99 of the 429 answers, ms (p50 {ov['refused_p50_ms']})", ov["refused_p99_ms"], "≤ 5",
            None if ov["refused_p99_ms"] is None else ov["refused_p99_ms"] <= 5)
        ratio = ov["accepted_p99_ms"] / lim["p99_ms"] if ov["accepted_p99_ms"] and lim["p99_ms"] else None
        add("overload", f"accepted p99 / p99 at the limit ({lim['p99_ms']} → {ov['accepted_p99_ms']} ms)",
            None if ratio is None else round(ratio, 2), "≤ 2", None if ratio is None else ratio <= 2)
        m = o["ivy_rss_mib"]
        add("overload", "Ivy RSS before → peak → after, MiB", f"{m['before']} → {m['peak']} → {m['after']}",
            "bounded (peak ≤ 2× before)", None if not m["before"] else m["peak"] <= 2 * m["before"])
        add("overload", "full service after the load ends, s", o["full_service_after_s"], "≤ 1",
            None if o["full_service_after_s"] is None else o["full_service_after_s"] <= 1)
    if "chaos" in r and "error" not in r["chaos"]:
        c = r["chaos"]
        kills = sum(e["signal"] == "SIGKILL" for e in c["chaos"]["events"])
        terms = sum(e["signal"] == "SIGTERM" for e in c["chaos"]["events"])
        add("chaos", f"{c['params']['documents']} documents; replica events during the job",
            f"{kills} SIGKILL, {terms} SIGTERM", "SIGKILLs every "
            f"{c['params']['event_every_s']:g} s, one SIGTERM per replica", terms >= 2 and kills >= 1)
        add("chaos", "failed client requests (requests `tulip-rose embed` had to retry)", c["failed_client_requests"], "0",
            c["failed_client_requests"] == 0)
        out = c["output"]
        add("chaos", "output vs the calm run: same rows and order; min cosine",
            f"{out.get('rows')} rows, {out.get('min_cosine', 0):.7f}" if out["same_shape"] else "shape differs",
            "≥ 0.99999 per vector", out["same_shape"] and out["below_0.99999"] == 0)
    if "fuzz_http" in r and "error" not in r["fuzz_http"]:
        f = r["fuzz_http"]
        add("fuzz HTTP", f"generated requests over {f['operations']} operations", f["requests"], "", None)
        add("fuzz HTTP", "responses ≥ 500", f["server_errors"], "0", f["server_errors"] == 0)
        add("fuzz HTTP", "answers outside the document (status, content type, body schema, error shape)",
            len(f["failures"]), "0", not f["failures"])
        add("fuzz HTTP", "Ivy crashed", f["crashed"], "no", not f["crashed"])
    if "fuzz_grpc" in r and "error" not in r["fuzz_grpc"]:
        for svc, g in r["fuzz_grpc"].items():
            if isinstance(g, dict) and "calls" in g:
                add(f"fuzz gRPC ({svc})", "calls (random bytes, truncated, bit-flipped, random values, unknown methods)",
                    g["calls"], "", None)
                add(f"fuzz gRPC ({svc})", "undefined status codes", len(g["findings"]), "0", not g["findings"])
                add(f"fuzz gRPC ({svc})", "crashed or stopped answering a good request",
                    g["crashed"] or g["probes_failed"] > 0, "no", not (g["crashed"] or g["probes_failed"]))
    if "tokenizer_fuzz" in r and "error" not in r["tokenizer_fuzz"]:
        t = r["tokenizer_fuzz"]
        add("tokenizer fuzz", "cargo-fuzz target `encode`, ours vs HF tokenizers", t["status"]
            + (f", {t['seconds']} s, exit {t['exit_code']}" if t["status"] == "ran" else ""), "10 min, no finding",
            (t["exit_code"] == 0 and t["seconds"] >= 590) if t["status"] == "ran" else None)
    for name in ("soak", "overload", "chaos", "fuzz_http", "fuzz_grpc", "tokenizer_fuzz"):
        if name in r and "error" in r[name]:
            add(name, "section failed to run", r[name]["error"][:200], "runs", False)
    return rows


def markdown(r: dict, figure: Path | None) -> str:
    parts = [f"Mode: **{r['mode']}** (`--{r['mode']}`); parameters: "
             + ", ".join(f"{k} {v:g}" for k, v in r["params"].items()), "",
             "Ivy + two Tulip replicas (all-MiniLM-L6-v2, 1 torch thread each) as real processes; the soak's "
             "rerank traffic goes to a second Ivy + Tulip on a tiny seeded BERT cross-encoder "
             "(MiniLM has no score head: its /rerank is a 424, sent as one of the bad requests). Latencies are "
             "measured by Python clients on the same machine, so they include the clients' own scheduling.", "",
             table(["section", "figure", "value", "target", "met"], checks(r))]
    if len(r.get("runs", [])) > 1:
        parts += ["", "The sections came from these runs (same mode, same folder):", ""]
        parts += [f"- `{run['command']}`: {', '.join(run['sections'])} (started {run['started']}, load average "
                  f"{run['loadavg_at_start']:.1f} at its start)" for run in r["runs"]]
    if figure:
        parts += ["", f"![RSS and p99 over time]({figure.name})"]
    f = r.get("fuzz_http", {})
    if f.get("failures"):
        parts += ["", "HTTP fuzz findings (first ones):", ""]
        parts += [f"- {x['operation']} ({x['mode']}): {x['problem'][:200]}" for x in f["failures"][:10]]
    for svc, g in (r.get("fuzz_grpc") or {}).items():
        if isinstance(g, dict) and g.get("findings"):
            parts += ["", f"gRPC fuzz findings ({svc}):", ""]
            parts += [f"- {x['method']} {x['how']}: {x['code']} {x['details'][:150]}" for x in g["findings"][:10]]
    c = r.get("chaos", {})
    if "failed_client_requests" in c:
        parts += ["", "Chaos: " + (
            "Ivy's own retries (a chunk whose replica fails goes to another, `--max-attempts`) absorbed every "
            "replica failure: the client never had to retry." if c["failed_client_requests"] == 0 else
            f"{c['failed_client_requests']} requests failed and were retried by `tulip-rose embed`: "
            + "; ".join(a["message"][:120] for a in c["chaos"]["failed_attempts"][:5]))]
        if c["chaos"].get("chaos_error"):
            parts += [f"The chaos thread stopped early: {c['chaos']['chaos_error']}"]
    if "tokenizer_fuzz" in r and r["tokenizer_fuzz"].get("status") != "ran":
        parts += ["", f"Tokenizer fuzzer: `{r['tokenizer_fuzz'].get('command')}`"]
    return "\n".join(parts)


def plot(r: dict, path: Path) -> Path | None:
    soak, over = r.get("soak", {}), r.get("overload", {})
    if "rss_samples" not in soak and "rss_samples" not in over:
        return None
    from bench.harness.plots import _plt

    plt = _plt()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    if "rss_samples" in soak:
        samples = soak["rss_samples"]
        for name in sorted({k for s in samples for k in s if k != "t"}):
            pts = [(s["t"], s[name]) for s in samples if name in s]
            axes[0].plot([p[0] for p in pts], [p[1] for p in pts], "o-", ms=2, label=name)
        axes[0].axvline(soak["params"]["warmup_s"], color="grey", ls=":", label="end of warm-up")
        axes[0].set(title="Soak: RSS per process", xlabel="s", ylabel="MiB")
        tl = [p for p in soak["latency_timeline"] if p["p99_ms"] is not None]
        axes[1].plot([p["t"] for p in tl], [p["p99_ms"] for p in tl], "o-", label="p99, all successful")
        q = [p for p in tl if p["query_p99_ms"] is not None]
        axes[1].plot([p["t"] for p in q], [p["query_p99_ms"] for p in q], "^:", label="p99, single queries")
        axes[1].set(title="Soak: p99 latency over time", xlabel="s", ylabel="ms")
    if "rss_samples" in over:
        pts = [(s["t"], s["ivy"]) for s in over["rss_samples"] if "ivy" in s]
        axes[2].plot([p[0] for p in pts], [p[1] for p in pts], "o-", ms=2, label="Ivy")
        axes[2].set(title=f"Overload ({over['params']['clients']} clients): Ivy RSS", xlabel="s", ylabel="MiB")
    for ax in axes:
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
