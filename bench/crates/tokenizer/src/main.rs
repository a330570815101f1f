//! Ivy's in-house tokenizer against Hugging Face `tokenizers` (the Rust
//! crate) on the same `tokenizer.json`, single thread, calls interleaved in
//! one run. Writes `tokenizer.json` and `tokenizer.md` into `--out`.
//!
//! cargo run --release -p ivy-tokenizer-bench -- --out bench/results/DATE-cpu-2core

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use ivy_tokenizer::{Direction, EncodeOptions, Encoding, Tokenizer};
use ivy_tokenizer_bench::{documents, english, multilingual, queries, tokenizer_path};
use serde_json::{json, Value};

/// Counts live heap bytes and allocation calls (for memory and allocs/call).
struct Counting;

static LIVE: AtomicI64 = AtomicI64::new(0);
static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every method forwards to the system allocator with the same
// arguments; counting touches no memory it hands out.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as i64, Ordering::Relaxed);
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as i64, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as i64 - l.size() as i64, Ordering::Relaxed);
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract, passed on unchanged.
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

struct Args {
    out: std::path::PathBuf,
    rounds: usize,
}

fn args() -> Args {
    let mut out = None;
    let mut rounds = 30;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--out" => out = it.next().map(Into::into),
            "--rounds" => rounds = it.next().and_then(|r| r.parse().ok()).expect("--rounds N"),
            _ => panic!("usage: tokenizer-bench --out DIR [--rounds N]"),
        }
    }
    Args {
        out: out.expect("--out DIR is required"),
        rounds,
    }
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

fn summary(mut ns: Vec<u64>, tokens: usize) -> Value {
    ns.sort_unstable();
    let total: u64 = ns.iter().sum();
    json!({
        "calls": ns.len(),
        "p50_us": percentile(&ns, 0.5),
        "p90_us": percentile(&ns, 0.9),
        "p99_us": percentile(&ns, 0.99),
        "tokens_per_s": tokens as f64 / (total as f64 / 1e9),
    })
}

/// How the two tokenizers take turns.
#[derive(Clone, Copy)]
enum Turns {
    /// Whole rounds over all inputs, alternating: each runs with its own
    /// data warm in cache, as in a process that only tokenizes.
    Rounds,
    /// Call by call: each call finds the other's data in cache, as when
    /// tokenization is one step among others.
    Calls,
}

/// Times both tokenizers on every input in the same run (which goes first
/// alternates), after one warm-up round.
fn compare(
    name: &str,
    ours: &Tokenizer,
    hf: &tokenizers::Tokenizer,
    inputs: &[String],
    opts: &EncodeOptions,
    rounds: usize,
    turns: Turns,
) -> Value {
    let mut enc = Encoding::default();
    let mut check_tokens = 0;
    for text in inputs {
        ours.encode_into(text, opts, &mut enc).unwrap();
        let want = hf.encode(text.as_str(), opts.add_special_tokens).unwrap();
        assert_eq!(
            enc.ids,
            want.get_ids(),
            "{name}: outputs differ on {text:?}"
        );
        check_tokens += enc.len();
    }
    let (mut t_ours, mut t_hf) = (Vec::new(), Vec::new());
    let mut ours_allocs = 0u64;
    let mut time_ours = |text: &String, record: bool, enc: &mut Encoding| {
        let a0 = ALLOCS.load(Ordering::Relaxed);
        let t = Instant::now();
        ours.encode_into(text, opts, enc).unwrap();
        let d = t.elapsed().as_nanos() as u64;
        let allocs = ALLOCS.load(Ordering::Relaxed) - a0;
        if record {
            t_ours.push(d);
            ours_allocs += allocs;
        }
    };
    let mut time_hf = |text: &String, record: bool| {
        let t = Instant::now();
        let e = hf.encode(text.as_str(), opts.add_special_tokens).unwrap();
        let d = t.elapsed().as_nanos() as u64;
        drop(e);
        if record {
            t_hf.push(d);
        }
    };
    for round in 0..=rounds {
        let record = round > 0;
        let ours_first = round % 2 == 0;
        match turns {
            Turns::Rounds => {
                for pass in 0..2 {
                    for text in inputs {
                        if (pass == 0) == ours_first {
                            time_ours(text, record, &mut enc);
                        } else {
                            time_hf(text, record);
                        }
                    }
                }
            }
            Turns::Calls => {
                for text in inputs {
                    if ours_first {
                        time_ours(text, record, &mut enc);
                        time_hf(text, record);
                    } else {
                        time_hf(text, record);
                        time_ours(text, record, &mut enc);
                    }
                }
            }
        }
    }
    let tokens = check_tokens * rounds;
    let s_ours = summary(t_ours, tokens);
    let s_hf = summary(t_hf, tokens);
    let ratio = s_hf["p50_us"].as_f64().unwrap() / s_ours["p50_us"].as_f64().unwrap();
    let tput = s_ours["tokens_per_s"].as_f64().unwrap() / s_hf["tokens_per_s"].as_f64().unwrap();
    let turns = match turns {
        Turns::Rounds => "rounds",
        Turns::Calls => "calls",
    };
    println!(
        "{name:<28} {turns:<6} inputs {:>4}  mean tokens {:>5.1}  p50 ours {:>8.2} us  hf {:>8.2} us  p50 speedup {ratio:>5.2}x  throughput {tput:>5.2}x",
        inputs.len(),
        check_tokens as f64 / inputs.len() as f64,
        s_ours["p50_us"].as_f64().unwrap(),
        s_hf["p50_us"].as_f64().unwrap(),
    );
    json!({
        "workload": name,
        "turns": turns,
        "inputs": inputs.len(),
        "mean_tokens": check_tokens as f64 / inputs.len() as f64,
        "ours": s_ours,
        "hf": s_hf,
        "p50_speedup": ratio,
        "throughput_ratio": tput,
        "ours_allocations_per_call": ours_allocs as f64 / (rounds * inputs.len()) as f64,
    })
}

/// Load time (median of 3) and the heap the loaded tokenizer keeps.
fn load(name: &str) -> (Value, Tokenizer, tokenizers::Tokenizer) {
    let path = tokenizer_path(name);
    let mut times = (Vec::new(), Vec::new());
    let (mut heap_ours, mut heap_hf) = (0, 0);
    let mut last = None;
    for _ in 0..3 {
        let live = LIVE.load(Ordering::Relaxed);
        let t = Instant::now();
        let ours = Tokenizer::from_file(&path).unwrap();
        times.0.push(t.elapsed());
        heap_ours = LIVE.load(Ordering::Relaxed) - live;
        let live = LIVE.load(Ordering::Relaxed);
        let t = Instant::now();
        let mut hf = tokenizers::Tokenizer::from_file(&path).unwrap();
        times.1.push(t.elapsed());
        heap_hf = LIVE.load(Ordering::Relaxed) - live;
        hf.with_truncation(None).unwrap();
        hf.with_padding(None);
        last = Some((ours, hf));
    }
    let (ours, hf) = last.unwrap();
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[1].as_secs_f64() * 1000.0
    };
    let info = json!({
        "tokenizer": name,
        "backend": ours.backend().to_string(),
        "load_ms_ours": median(&mut times.0),
        "load_ms_hf": median(&mut times.1),
        "heap_bytes_ours": heap_ours,
        "heap_bytes_hf": heap_hf,
        "vocab_structure_bytes_ours": ours.vocab_memory_bytes(),
    });
    println!("{info}");
    (info, ours, hf)
}

fn markdown(results: &[Value], loads: &[Value], command: &str, machine: &str) -> String {
    let mut md =
        String::from("# Tokenizer: in-house vs Hugging Face `tokenizers` 0.23.2 (Rust crate)\n\n");
    md += &format!("Command: `{command}`\n\nMachine: {machine}. Single thread, both tokenizers in the same run on the same inputs and `tokenizer.json`, one warm-up round; latencies are per call (`Instant` around each call); outputs checked identical before timing. *rounds*: whole passes over the inputs alternate between the two (each has its own data warm in cache); *calls*: the two alternate call by call (each call finds the other's data in cache). Which goes first alternates by round.\n\n");
    md += "| workload | turns | inputs | mean tokens | ours p50 µs | ours p90 | ours p99 | HF p50 µs | HF p90 | HF p99 | p50 speedup | throughput ours / HF (tokens/s) | ours allocs/call |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|\n";
    for r in results {
        let (o, h) = (&r["ours"], &r["hf"]);
        md += &format!(
            "| {} | {} | {} | {:.1} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | **{:.2}×** | {:.0} / {:.0} ({:.2}×) | {:.2} |\n",
            r["workload"].as_str().unwrap(),
            r["turns"].as_str().unwrap(),
            r["inputs"],
            r["mean_tokens"].as_f64().unwrap(),
            o["p50_us"].as_f64().unwrap(),
            o["p90_us"].as_f64().unwrap(),
            o["p99_us"].as_f64().unwrap(),
            h["p50_us"].as_f64().unwrap(),
            h["p90_us"].as_f64().unwrap(),
            h["p99_us"].as_f64().unwrap(),
            r["p50_speedup"].as_f64().unwrap(),
            o["tokens_per_s"].as_f64().unwrap(),
            h["tokens_per_s"].as_f64().unwrap(),
            r["throughput_ratio"].as_f64().unwrap(),
            r["ours_allocations_per_call"].as_f64().unwrap(),
        );
    }
    md += "\n| tokenizer | load ours (ms) | load HF (ms) | heap kept ours (MB) | heap kept HF (MB) | ours trie + piece strings (MB) |\n|---|---:|---:|---:|---:|---:|\n";
    for l in loads {
        let mb = |v: &Value| v.as_f64().unwrap_or(0.0) / 1e6;
        md += &format!(
            "| {} | {:.0} | {:.0} | {:.1} | {:.1} | {:.1} |\n",
            l["tokenizer"].as_str().unwrap(),
            l["load_ms_ours"].as_f64().unwrap(),
            l["load_ms_hf"].as_f64().unwrap(),
            mb(&l["heap_bytes_ours"]),
            mb(&l["heap_bytes_hf"]),
            mb(&l["vocab_structure_bytes_ours"]),
        );
    }
    md
}

fn main() {
    let args = args();
    let command = format!(
        "cargo run --release -p ivy-tokenizer-bench -- {}",
        std::env::args().skip(1).collect::<Vec<_>>().join(" ")
    );
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let machine = format!(
        "{cpu}, {} cores available",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );

    let (xlmr_load, xlmr, xlmr_hf) = load("xlm-roberta");
    let (bert_load, bert, bert_hf) = load("all-minilm-l6-v2");

    let ml = multilingual();
    let en = english();
    let xq = queries(&xlmr, &ml);
    let xd = documents(&xlmr, &ml, 48);
    let bq = queries(&bert, &en);
    let bd = documents(&bert, &en, 48);

    let plain = EncodeOptions::default();
    let to512 = EncodeOptions {
        add_special_tokens: true,
        max_length: Some(512),
        direction: Direction::Right,
    };
    let mut xlmr_hf512 = xlmr_hf.clone();
    let trunc = Some(tokenizers::TruncationParams {
        max_length: 512,
        ..Default::default()
    });
    xlmr_hf512.with_truncation(trunc.clone()).unwrap();
    let mut bert_hf512 = bert_hf.clone();
    bert_hf512.with_truncation(trunc).unwrap();
    let workloads: [(
        &str,
        &Tokenizer,
        &tokenizers::Tokenizer,
        &[String],
        &EncodeOptions,
    ); 4] = [
        ("XLM-R queries (10-30 tok)", &xlmr, &xlmr_hf, &xq, &plain),
        (
            "XLM-R documents (~512 tok)",
            &xlmr,
            &xlmr_hf512,
            &xd,
            &to512,
        ),
        ("WordPiece queries", &bert, &bert_hf, &bq, &plain),
        (
            "WordPiece documents (~512)",
            &bert,
            &bert_hf512,
            &bd,
            &to512,
        ),
    ];
    let mut results = Vec::new();
    for turns in [Turns::Rounds, Turns::Calls] {
        for (name, ours, hf, inputs, opts) in workloads {
            results.push(compare(name, ours, hf, inputs, opts, args.rounds, turns));
        }
    }
    let loads = vec![xlmr_load, bert_load];
    std::fs::create_dir_all(&args.out).unwrap();
    // `results` holds the headline measurement (whole rounds, each
    // tokenizer in its own steady state, as criterion measures too); the
    // call-by-call variant is kept beside it.
    let (rounds, calls): (Vec<Value>, Vec<Value>) = results
        .iter()
        .cloned()
        .partition(|r| r["turns"] == "rounds");
    let doc = json!({
        "command": command,
        "machine": machine,
        "hf_tokenizers_version": "0.23.2",
        "rounds": args.rounds,
        "results": rounds,
        "results_call_by_call": calls,
        "load": loads,
    });
    std::fs::write(
        args.out.join("tokenizer.json"),
        serde_json::to_string_pretty(&doc).unwrap(),
    )
    .unwrap();
    std::fs::write(
        args.out.join("tokenizer.md"),
        markdown(&results, &loads, &command, &machine),
    )
    .unwrap();
    println!("wrote {}", args.out.join("tokenizer.md").display());
}
