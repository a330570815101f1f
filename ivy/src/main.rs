//! Ivy: the gateway in front of Tulip replicas. Parses and validates HTTP
//! (OpenAI- and TEI-compatible) and gRPC requests, applies templates,
//! tokenizes, cuts requests into chunks on a token budget and sends each to
//! the least-loaded healthy replica, retrying elsewhere when one fails.

mod batch;
mod config;
mod error;
mod grpc;
mod http;
mod metrics;
mod model;
mod net;
mod pipeline;
mod request;
mod server;
mod state;
mod upstream;

use std::time::Duration;

use clap::Parser;

use crate::config::Config;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Time the runtime gives stray tasks (blocking tokenization) at exit.
const EXIT_GRACE: Duration = Duration::from_secs(1);

/// A single-threaded runtime when asked for one thread: its tasks wake each
/// other without crossing threads. Otherwise a work-stealing pool.
fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    let threads = match threads {
        0 => default_threads(),
        n => n,
    };
    let mut builder = match threads {
        1 => tokio::runtime::Builder::new_current_thread(),
        _ => tokio::runtime::Builder::new_multi_thread(),
    };
    if threads > 1 {
        builder.worker_threads(threads);
    }
    builder.enable_all().build()
}

/// Half the cores this process may use, at least one (see `--io-threads`).
fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}

/// No transparent huge pages for Ivy's heap. mimalloc asks for them on its
/// arenas (`MADV_HUGEPAGE`), so the resident size moved in 2 MiB steps as
/// khugepaged collapsed pages: +21% over a 30-minute soak, all of it huge
/// pages, with nothing leaking. Ivy's heap is tens of MiB, where huge pages
/// save nothing measurable. This runs as a constructor ahead of mimalloc's
/// own (priority 101), so no page is faulted in huge before it.
#[cfg(target_os = "linux")]
#[used]
#[unsafe(link_section = ".init_array.00100")]
static NO_HUGE_PAGES: extern "C" fn() = no_huge_pages;

#[cfg(target_os = "linux")]
extern "C" fn no_huge_pages() {
    // SAFETY: PR_SET_THP_DISABLE takes plain integers and touches no
    // memory; a kernel without it returns an error, which changes nothing.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

fn main() -> std::process::ExitCode {
    let config = Config::parse();
    // TLS everywhere (the listeners, the object store's and the image
    // fetches' reqwest clients) is rustls on ring: one process-wide
    // provider, installed before any client is built.
    let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
    let settings = telemetry::Settings {
        filter: &config.log,
        json: config.json_output,
        otlp: config
            .otlp_endpoint
            .clone()
            .map(|endpoint| telemetry::Otlp {
                endpoint,
                service_name: config.otlp_service_name.clone(),
                untraced_paths: &request::auth::PUBLIC_PATHS,
            }),
    };
    // Held to the end: dropping it flushes the spans not yet exported.
    let _traces = match telemetry::init(settings) {
        Ok(guard) => guard,
        Err(e) => {
            eprintln!("ivy: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let runtime = match runtime(config.io_threads) {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return std::process::ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(server::run(config));
    runtime.shutdown_timeout(EXIT_GRACE);
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            std::process::ExitCode::FAILURE
        }
    }
}
