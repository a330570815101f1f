//! Images/s of `ImageProcessor::prepare` on image files, one thread: the
//! Rust side of `python -m bench image-prep` (issue 48).
//!
//! ```text
//! cargo run --release -p ivy-imageprep --example prep_rate -- \
//!     CONFIG.json [--rounds N] [--min-seconds S] [--dump DIR] IMAGE...
//! ```
//!
//! Each image is read into memory, prepared once (warm-up, and the tensor's
//! sum), then timed in `--rounds` rounds (default 5), each preparing it
//! from its bytes (decode included) again and again until at least
//! `--min-seconds` (default 0.2) have passed. Prints one JSON object on
//! stdout: per image its rounds' images/s and their median, the tensor's
//! shape and sum. `--rounds 0` only prepares; `--dump DIR` also writes each
//! tensor as `DIR/<index>.f32` (little-endian `f32`, channels first) for a
//! pixel-by-pixel comparison.

use std::hint::black_box;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use ivy_imageprep::{ImageProcessor, Limits};
use serde_json::{json, Value};

struct Args {
    config: PathBuf,
    images: Vec<PathBuf>,
    rounds: usize,
    min_seconds: f64,
    dump: Option<PathBuf>,
}

const USAGE: &str =
    "usage: prep_rate CONFIG.json [--rounds N] [--min-seconds S] [--dump DIR] IMAGE...";

fn parse() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let (mut config, mut images) = (None, Vec::new());
    let (mut rounds, mut min_seconds, mut dump) = (5, 0.2, None);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match arg.as_str() {
            "--rounds" => {
                rounds = value("--rounds")?
                    .parse()
                    .map_err(|e| format!("--rounds: {e}"))?
            }
            "--min-seconds" => {
                min_seconds = value("--min-seconds")?
                    .parse()
                    .map_err(|e| format!("--min-seconds: {e}"))?
            }
            "--dump" => dump = Some(PathBuf::from(value("--dump")?)),
            "-h" | "--help" => return Err(USAGE.into()),
            _ if arg.starts_with("--") => return Err(format!("unknown option {arg}\n{USAGE}")),
            _ if config.is_none() => config = Some(PathBuf::from(arg)),
            _ => images.push(PathBuf::from(arg)),
        }
    }
    let config = config.ok_or(USAGE)?;
    if images.is_empty() {
        return Err(USAGE.into());
    }
    Ok(Args {
        config,
        images,
        rounds,
        min_seconds,
        dump,
    })
}

fn median(values: &mut [f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    Some(if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    })
}

fn run(args: &Args) -> Result<Value, String> {
    let read = |p: &PathBuf| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
    let config: Value = serde_json::from_slice(&read(&args.config)?)
        .map_err(|e| format!("{}: {e}", args.config.display()))?;
    let processor = ImageProcessor::from_config(&config)
        .map_err(|e| format!("{}: {e}", args.config.display()))?;
    let limits = Limits::default();
    let mut out = Vec::new();
    for (index, path) in args.images.iter().enumerate() {
        let bytes = read(path)?;
        let prepare = |b: &[u8]| {
            processor
                .prepare(b, &limits)
                .map_err(|e| format!("{}: {e}", path.display()))
        };
        let first = prepare(&bytes)?;
        let sum: f64 = first.data.iter().map(|&v| f64::from(v)).sum();
        if let Some(dir) = &args.dump {
            let raw: Vec<u8> = first.data.iter().flat_map(|v| v.to_le_bytes()).collect();
            let file = dir.join(format!("{index}.f32"));
            std::fs::write(&file, raw).map_err(|e| format!("{}: {e}", file.display()))?;
        }
        let mut rates = Vec::with_capacity(args.rounds);
        let mut iterations = Vec::with_capacity(args.rounds);
        for _ in 0..args.rounds {
            let (start, mut n) = (Instant::now(), 0u64);
            let elapsed = loop {
                black_box(prepare(black_box(&bytes))?);
                n += 1;
                let t = start.elapsed().as_secs_f64();
                if t >= args.min_seconds {
                    break t;
                }
            };
            rates.push(n as f64 / elapsed);
            iterations.push(n);
        }
        let rounds = rates.clone();
        out.push(json!({
            "path": path.display().to_string(),
            "encoded_bytes": bytes.len(),
            "shape": [3, first.height, first.width],
            "sum": sum,
            "images_per_s": median(&mut rates),
            "rounds_images_per_s": rounds,
            "rounds_iterations": iterations,
        }));
    }
    Ok(json!({
        "program": "ivy-imageprep prep_rate",
        "config": args.config.display().to_string(),
        "rounds": args.rounds,
        "min_seconds": args.min_seconds,
        "debug_assertions": cfg!(debug_assertions),
        "images": out,
    }))
}

fn main() -> ExitCode {
    let result = parse().and_then(|args| run(&args));
    match result {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("prep_rate: {message}");
            ExitCode::FAILURE
        }
    }
}
