//! Tulip: a gRPC inference server for embedding models, built as a Python
//! extension module. The Python launcher (`python -m tulip`) builds the
//! engine and calls `serve()`, which runs tonic and the scheduler in Rust.

mod adapters;
mod backlog;
mod completion;
mod config;
pub mod cuda;
mod engine;
mod error;
mod event;
mod frames;
mod metrics;
mod metrics_http;
mod model;
mod output;
mod pace;
mod priority;
mod queue;
mod scheduler;
mod server;
mod service;
mod sim_event;
mod unix_socket;
mod validate;

use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::config::ServeConfig;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Serves `engine` over gRPC until Ctrl-C or SIGTERM, then drains.
///
/// `engine` has `info` and `step_arena(arena, sequences, tokens, kind) ->
/// (lazy, host_ptr, rows, cols, event, mode, padded_tokens,
/// capture_seconds)` (see `rose/engine.py`); `invalid_batch_error` is the
/// exception it raises for a batch the caller got wrong (see
/// `rose/interface.py`).
#[pyfunction]
#[pyo3(signature = (
    engine, invalid_batch_error, *, host = "0.0.0.0".to_string(), port = 7070,
    max_batch_tokens = 16384, max_batch_sequences = 64, max_request_sequences = 2048,
    max_inflight = 2, drain_timeout = 30.0, max_message_bytes = 256 * 1024 * 1024,
    metrics_port = 7071, log = "info".to_string(), inline_steps = true, unix_socket = None, io_threads = 0,
    json_output = false, priority = true, batch_max_wait_ms = 500, batch_step_tokens = 0,
    batch_step_ms = 0.0, interactive_fill_ms = f64::INFINITY, batch_inflight = 0, launch_ahead = false,
    otlp_endpoint = None, otlp_service_name = "tulip".to_string(),
))]
#[allow(clippy::too_many_arguments)]
fn serve(
    py: Python<'_>,
    engine: Py<PyAny>,
    invalid_batch_error: Py<PyAny>,
    host: String,
    port: u16,
    max_batch_tokens: usize,
    max_batch_sequences: usize,
    max_request_sequences: usize,
    max_inflight: usize,
    drain_timeout: f64,
    max_message_bytes: usize,
    metrics_port: u16,
    log: String,
    inline_steps: bool,
    unix_socket: Option<String>,
    io_threads: usize,
    json_output: bool,
    priority: bool,
    batch_max_wait_ms: u64,
    batch_step_tokens: usize,
    batch_step_ms: f64,
    interactive_fill_ms: f64,
    batch_inflight: usize,
    launch_ahead: bool,
    otlp_endpoint: Option<String>,
    otlp_service_name: String,
) -> PyResult<()> {
    // Held while serving: dropping it flushes the spans not yet exported.
    let _traces = telemetry::init(telemetry::Settings {
        filter: &log,
        json: json_output,
        otlp: otlp_endpoint.map(|endpoint| telemetry::Otlp {
            endpoint,
            service_name: otlp_service_name,
            untraced_paths: &[],
        }),
    })
    .map_err(PyValueError::new_err)?;
    if !(drain_timeout.is_finite() && drain_timeout >= 0.0) {
        return Err(PyValueError::new_err(
            "drain_timeout must be a non-negative number of seconds",
        ));
    }
    let millis = |name: &str, ms: f64| -> PyResult<Duration> {
        if ms.is_nan() || ms < 0.0 {
            return Err(PyValueError::new_err(format!(
                "{name} must be a number of milliseconds >= 0, got {ms}"
            )));
        }
        Ok(Duration::try_from_secs_f64(ms / 1e3).unwrap_or(Duration::MAX))
    };
    let config = ServeConfig {
        host,
        port,
        max_batch_tokens,
        max_batch_sequences,
        max_request_sequences,
        max_inflight,
        drain_timeout: Duration::from_secs_f64(drain_timeout),
        max_message_bytes,
        metrics_port,
        inline_steps,
        unix_socket,
        io_threads,
        priority: priority::Settings {
            enabled: priority,
            batch_max_wait: Duration::from_millis(batch_max_wait_ms),
            batch_step_tokens,
            batch_step_time: millis("batch_step_ms", batch_step_ms)?,
            interactive_fill: millis("interactive_fill_ms", interactive_fill_ms)?,
            batch_inflight,
            launch_ahead,
        },
    };
    server::serve(py, engine, invalid_batch_error, config)
}

/// Blocks until a CUDA event (a raw `cudaEvent_t`, e.g. `torch.cuda.Event().cuda_event`,
/// or a simulated device's tagged handle, `rose/sim/events.py`) has
/// completed, with the GIL released: the same wait Tulip's completion
/// thread performs. 0 means "no event" and returns at once. Raises
/// `TimeoutError` after `timeout_s` (default `$TULIP_EVENT_TIMEOUT_S`, else
/// 120 s) and `RuntimeError` naming the CUDA error otherwise.
#[pyfunction]
#[pyo3(signature = (handle, timeout_s=None))]
fn wait_event(py: Python<'_>, handle: usize, timeout_s: Option<f64>) -> PyResult<()> {
    let timeout = timeout_s.map_or_else(event::default_timeout, Duration::from_secs_f64);
    py.detach(|| event::wait_for(handle, timeout))
        .map_err(|e| match e {
            event::WaitError::Timeout(_) => {
                pyo3::exceptions::PyTimeoutError::new_err(e.to_string())
            }
            _ => pyo3::exceptions::PyRuntimeError::new_err(e.to_string()),
        })
}

/// Which GPU's primary context threads without a CUDA context use when
/// they wait on events (`"cuda:1"`); anything but a CUDA device is ignored.
/// Tulip's launcher calls it with the engine's device before serving.
#[pyfunction]
fn bind_cuda_device(device: &str) {
    if let Some(n) = cuda::ordinal(device) {
        cuda::bind_device(n);
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(serve, m)?)?;
    m.add_function(wrap_pyfunction!(wait_event, m)?)?;
    m.add_function(wrap_pyfunction!(bind_cuda_device, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
