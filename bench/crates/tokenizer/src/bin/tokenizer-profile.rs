//! Runs one tokenizer on one workload in a loop, for `perf record`:
//!
//! perf record -g target/release/tokenizer-profile xlm-roberta documents 200 [hf]
//!
//! (the third argument is the number of passes over the inputs).

use std::time::Instant;

use ivy_tokenizer::{EncodeOptions, Encoding, Tokenizer};
use ivy_tokenizer_bench::{documents, english, multilingual, queries, tokenizer_path};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: tokenizer-profile TOKENIZER queries|documents PASSES [hf]";
    let name = args.first().expect(usage);
    let kind = args.get(1).expect(usage);
    let passes: u64 = args.get(2).and_then(|s| s.parse().ok()).expect(usage);
    let hf = args.get(3).is_some_and(|a| a == "hf");
    let ours = Tokenizer::from_file(tokenizer_path(name)).unwrap();
    let lines = if name == "all-minilm-l6-v2" {
        english()
    } else {
        multilingual()
    };
    let inputs = match kind.as_str() {
        "queries" => queries(&ours, &lines),
        "documents" => documents(&ours, &lines, 48),
        _ => panic!("{usage}"),
    };
    let inputs: Vec<String> = match std::env::var("IVY_PROFILE_ONLY")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
    {
        Some(i) => vec![inputs[i % inputs.len()].clone()],
        None => inputs,
    };
    let oracle = hf.then(|| tokenizers::Tokenizer::from_file(tokenizer_path(name)).unwrap());
    let opts = EncodeOptions::default();
    let mut enc = Encoding::default();
    let (start, cpu0, mut calls) = (Instant::now(), cpu_seconds(), 0u64);
    for _ in 0..passes {
        for t in &inputs {
            if let Some(oracle) = &oracle {
                oracle.encode(t.as_str(), true).unwrap();
            } else {
                ours.encode_into(t, &opts, &mut enc).unwrap();
            }
            calls += 1;
        }
    }
    let cpu = cpu_seconds() - cpu0;
    let per = start.elapsed().as_secs_f64() * 1e6 / calls as f64;
    println!(
        "{calls} calls, {per:.2} us/call wall, {:.2} us/call CPU",
        cpu * 1e6 / calls as f64
    );
}

/// User + system CPU time of this process (Linux `/proc/self/stat`), which
/// a busy shared machine disturbs less than wall time.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit(')')
        .next()
        .unwrap_or("")
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}
