//! `loadgen`: sends prepared requests to a Tulip (gRPC `tulip.v1.Tulip/Embed`)
//! or to Ivy (HTTP POST, JSON) from 1..N concurrent clients and prints the
//! latencies as JSON. A Python client costs about as much per request as the
//! server being measured; this one costs a few microseconds, and `--floor`
//! measures exactly how many, against a null server in the same process
//! (each run records it beside its figures).
//!
//! ```text
//! loadgen --mode grpc --target 127.0.0.1:50051 --input reqs.json --concurrency 1,4,16 --requests 64
//! loadgen --mode http --target 127.0.0.1:8080 --input q.json --rate 100 --duration-s 20 --connections 64
//! ```
//!
//! The second form is an open loop (`rate.rs`): requests on a fixed
//! schedule, whatever the answers take.

mod http;
mod input;
mod null;
mod rate;
mod run;

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// tulip.v1 Embed over gRPC; input: {"requests": [{"token_ids": [..], "lengths": [..]}]}
    Grpc,
    /// POST over HTTP/1.1 keep-alive; input: {"path": "/v1/embeddings", "bodies": [{..}]}
    Http,
}

/// Load generator for the GPU charts (see bench/gpu/README.md).
#[derive(Parser, Debug)]
#[command(version)]
pub struct Args {
    /// What to send.
    #[arg(long, env = "LOADGEN_MODE", value_enum, default_value = "grpc")]
    pub mode: Mode,
    /// host:port of the server.
    #[arg(long, env = "LOADGEN_TARGET")]
    pub target: Option<String>,
    /// JSON file with the prepared requests (clients take them round-robin).
    #[arg(long, env = "LOADGEN_INPUT")]
    pub input: PathBuf,
    /// Concurrency levels to run one after the other, e.g. "1,2,4,8,16".
    #[arg(
        long,
        env = "LOADGEN_CONCURRENCY",
        value_delimiter = ',',
        default_value = "1"
    )]
    pub concurrency: Vec<usize>,
    /// Timed requests per level, split over its clients.
    #[arg(long, env = "LOADGEN_REQUESTS", default_value_t = 64)]
    pub requests: usize,
    /// Untimed requests per client before each level.
    #[arg(long, env = "LOADGEN_WARMUP", default_value_t = 3)]
    pub warmup: usize,
    /// Seconds before one request counts as failed.
    #[arg(long, env = "LOADGEN_TIMEOUT_S", default_value_t = 60.0)]
    pub timeout_s: f64,
    /// Also run level 1 against a null server in this process (the client's
    /// own cost plus loopback), reported as "floor".
    #[arg(long, env = "LOADGEN_FLOOR")]
    pub floor: bool,
    /// Open loop: requests per second on a fixed schedule (instead of the
    /// concurrency levels), for --duration-s, from --connections connections.
    #[arg(long, env = "LOADGEN_RATE")]
    pub rate: Option<f64>,
    /// Open loop: seconds of the schedule.
    #[arg(long, env = "LOADGEN_DURATION_S", default_value_t = 10.0)]
    pub duration_s: f64,
    /// Open loop: keep-alive connections the schedule's requests go out on.
    #[arg(long, env = "LOADGEN_CONNECTIONS", default_value_t = 64)]
    pub connections: usize,
    /// Open loop: open and warm the connections, print "ready" to stderr,
    /// and start the schedule when a line arrives on stdin.
    #[arg(long, env = "LOADGEN_GO_STDIN")]
    pub go_stdin: bool,
}

fn main() {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match runtime.block_on(run::main(args)) {
        Ok(report) => println!("{report}"),
        Err(e) => {
            eprintln!("loadgen: {e}");
            std::process::exit(1);
        }
    }
}
