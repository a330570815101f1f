//! `serve()`: starts the scheduler and completion threads and the tonic
//! server, waits (detached from Python) until Ctrl-C/SIGTERM, then drains.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use proto::tulip::v1::tulip_server::TulipServer;
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use tokio::runtime::Runtime;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::server::Router;
use tonic::transport::Server;
use tonic_health::server::HealthReporter;
use tonic_health::ServingStatus;

use crate::adapters::Adapters;
use crate::config::ServeConfig;
use crate::engine::EngineHandle;
use crate::metrics::Metrics;
use crate::model::ModelInfo;
use crate::queue::Pool;
use crate::service::{ServiceState, TulipService};
use crate::validate::Limits;
use crate::{completion, metrics_http, scheduler, unix_socket};

/// How often the waiting main thread looks for Python signals.
const SIGNAL_POLL: Duration = Duration::from_millis(100);
/// How long the gRPC server may take to close its connections at the end.
const SERVER_STOP: Duration = Duration::from_secs(5);

type ServerTask = JoinHandle<Result<(), tonic::transport::Error>>;
type UnixIncoming = tokio_stream::wrappers::ReceiverStream<std::io::Result<unix_socket::Sniffed>>;

pub fn serve(
    py: Python<'_>,
    engine: Py<PyAny>,
    invalid_batch: Py<PyAny>,
    config: ServeConfig,
) -> PyResult<()> {
    config.check().map_err(PyValueError::new_err)?;
    let engine = Arc::new(EngineHandle::new(py, engine, invalid_batch)?);
    let model = Arc::new(engine.info(py)?);
    let (loaded, max_adapters, max_rank) = engine.adapters(py)?;
    let adapters = Arc::new(Adapters::new(loaded, max_adapters, max_rank));
    warn_if_budget_too_small(&model, &config);
    let runtime = runtime(config.io_threads)?;
    let listeners = Listeners::bind(&runtime, &config)?;

    let metrics = Metrics::new();
    metrics.declare_modes(engine.modes());
    let pool = new_pool(&model, &config);
    let threads = start_engine_threads(&pool, &engine, &metrics)?;
    let state = Arc::new(ServiceState::default());
    let service = Arc::new(TulipService {
        pool: Arc::clone(&pool),
        engine,
        model: Arc::clone(&model),
        limits: Limits {
            max_request_sequences: config.max_request_sequences,
        },
        state: Arc::clone(&state),
        metrics: Arc::clone(&metrics),
        unix_frames: listeners.unix.is_some(),
        adapters,
    });
    let addr = listeners.addr;
    let running = start_servers(&runtime, &config, listeners, service, &metrics, &pool);
    log_ready(&model, &addr, config.unix_socket.as_deref());

    let outcome = wait_for_signal(py, &running.grpc);

    // Drain: refuse new work, let in-flight requests finish, then stop.
    refuse_new_work(&runtime, &state, &metrics, &running.health);
    py.detach(|| {
        wait_for_active(&state, config.drain_timeout);
        stop_all(runtime, &config, &pool, threads, running);
    });
    // Outputs that completed after the scheduler stopped.
    for output in pool.take_releases() {
        EngineHandle::release(py, output);
    }
    tracing::info!("stopped");
    outcome.map_err(PyRuntimeError::new_err)
}

fn new_pool(model: &ModelInfo, config: &ServeConfig) -> Arc<Pool> {
    Arc::new(Pool::new(
        config.max_batch_tokens,
        config.max_batch_sequences,
        max_inflight(model, config),
        config.inline_steps,
        config.priority.clone(),
    ))
}

/// The servers started by `start_servers`, with what stops them.
struct Running {
    health: HealthReporter,
    grpc: Vec<ServerTask>,
    stop: watch::Sender<bool>,
    metrics_server: Option<JoinHandle<()>>,
    metrics_stop: watch::Sender<bool>,
}

/// Starts the metrics server, marks the service healthy, then starts the
/// gRPC servers on every listener.
fn start_servers(
    runtime: &Runtime,
    config: &ServeConfig,
    listeners: Listeners,
    service: Arc<TulipService>,
    metrics: &Arc<Metrics>,
    pool: &Arc<Pool>,
) -> Running {
    let (health, health_service) = tonic_health::server::health_reporter();
    let (stop, stop_rx) = watch::channel(false);
    // The metrics server outlives the gRPC drain, so the drain is observable.
    let (metrics_stop, metrics_stop_rx) = watch::channel(false);
    let metrics_server = listeners.metrics.map(|listener| {
        runtime.spawn(metrics_http::serve(
            listener,
            Arc::clone(metrics),
            Arc::clone(pool),
            Arc::clone(&service.engine),
            stopped(metrics_stop_rx),
        ))
    });
    runtime.block_on(set_serving(&health, true));
    let router = Server::builder()
        .tcp_nodelay(true)
        .add_service(health_service)
        .add_service(
            TulipServer::from_arc(Arc::clone(&service))
                .max_decoding_message_size(config.max_message_bytes)
                .max_encoding_message_size(usize::MAX),
        );
    let unix = listeners.unix.map(|listener| {
        let _guard = runtime.enter();
        unix_socket::accept(listener, service, config.max_message_bytes, stop_rx.clone())
    });
    let grpc = start_grpc(runtime, router, listeners.grpc, unix, &stop_rx);
    Running {
        health,
        grpc,
        stop,
        metrics_server,
        metrics_stop,
    }
}

fn refuse_new_work(
    runtime: &Runtime,
    state: &ServiceState,
    metrics: &Metrics,
    health: &HealthReporter,
) {
    state.draining.store(true, Ordering::SeqCst);
    metrics.draining.set(1);
    runtime.block_on(set_serving(health, false));
}

/// Stops the engine threads, the gRPC servers and, last, the metrics server.
fn stop_all(
    runtime: Runtime,
    config: &ServeConfig,
    pool: &Pool,
    threads: [thread::JoinHandle<()>; 2],
    running: Running,
) {
    let _ = running.stop.send(true);
    pool.shutdown();
    for t in threads {
        let _ = t.join();
    }
    for server in running.grpc {
        stop_task(&runtime, server);
    }
    let _ = running.metrics_stop.send(true);
    if let Some(m) = running.metrics_server {
        let _ = runtime.block_on(async { tokio::time::timeout(SERVER_STOP, m).await });
    }
    runtime.shutdown_timeout(Duration::from_secs(1));
    if let Some(path) = &config.unix_socket {
        let _ = std::fs::remove_file(path);
    }
}

fn warn_if_budget_too_small(model: &ModelInfo, config: &ServeConfig) {
    if (model.max_input_length as usize) > config.max_batch_tokens {
        tracing::warn!(
            max_input_length = model.max_input_length,
            max_batch_tokens = config.max_batch_tokens,
            "a single long sequence may exceed the batch token budget; it runs alone"
        );
    }
}

/// A CPU step finishes before `step()` returns: a second one in flight
/// would only compete for the same cores.
fn max_inflight(model: &ModelInfo, config: &ServeConfig) -> usize {
    if model.device.starts_with("cpu") {
        1
    } else {
        config.max_inflight
    }
}

fn runtime(threads: usize) -> PyResult<Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if threads > 0 {
        builder.worker_threads(threads);
    }
    builder
        .enable_all()
        .thread_name("tulip-io")
        .build()
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start the async runtime: {e}")))
}

/// Every socket Tulip listens on, bound before anything starts so that a
/// taken port fails start-up with a clear message.
struct Listeners {
    addr: SocketAddr,
    grpc: tokio::net::TcpListener,
    unix: Option<tokio::net::UnixListener>,
    metrics: Option<tokio::net::TcpListener>,
}

impl Listeners {
    fn bind(runtime: &Runtime, config: &ServeConfig) -> PyResult<Self> {
        let addr: SocketAddr = format!("{}:{}", config.host, config.port)
            .parse()
            .map_err(|e| {
                PyValueError::new_err(format!(
                    "invalid listen address {}:{}: {e}",
                    config.host, config.port
                ))
            })?;
        let _guard = runtime.enter();
        let grpc = runtime
            .block_on(tokio::net::TcpListener::bind(addr))
            .map_err(|e| {
                PyOSError::new_err(format!(
                    "cannot listen on {addr} (--port): {e}; pass another --port"
                ))
            })?;
        let unix = match &config.unix_socket {
            None => None,
            Some(path) => {
                // A socket file left by a process that died is in the way.
                let _ = std::fs::remove_file(path);
                Some(tokio::net::UnixListener::bind(path).map_err(|e| {
                    PyOSError::new_err(format!(
                        "cannot listen on unix socket {path} (--unix-socket): {e}"
                    ))
                })?)
            }
        };
        let metrics = match config.metrics_port {
            0 => None,
            port => {
                let addr = SocketAddr::new(addr.ip(), port);
                Some(
                    runtime
                        .block_on(tokio::net::TcpListener::bind(addr))
                        .map_err(|e| {
                            PyOSError::new_err(format!(
                                "cannot listen on {addr} (--metrics-port): {e}; pass another \
                                 --metrics-port (0 = off)"
                            ))
                        })?,
                )
            }
        };
        Ok(Self {
            addr,
            grpc,
            unix,
            metrics,
        })
    }
}

fn start_engine_threads(
    pool: &Arc<Pool>,
    engine: &Arc<EngineHandle>,
    metrics: &Arc<Metrics>,
) -> PyResult<[thread::JoinHandle<()>; 2]> {
    let (done_tx, done_rx) = mpsc::channel();
    Ok([
        spawn("tulip-scheduler", {
            let (pool, engine, metrics) =
                (Arc::clone(pool), Arc::clone(engine), Arc::clone(metrics));
            move || scheduler::run(pool, engine, done_tx, metrics)
        })?,
        spawn("tulip-completion", {
            let (pool, metrics) = (Arc::clone(pool), Arc::clone(metrics));
            move || completion::run(pool, done_rx, metrics)
        })?,
    ])
}

/// One server per listener (TCP, and the Unix socket's gRPC connections
/// when asked for), all with the same services and the same stop signal.
fn start_grpc(
    runtime: &Runtime,
    router: Router,
    tcp: tokio::net::TcpListener,
    unix: Option<UnixIncoming>,
    stop: &watch::Receiver<bool>,
) -> Vec<ServerTask> {
    let mut servers = Vec::new();
    if let Some(incoming) = unix {
        let fut = router
            .clone()
            .serve_with_incoming_shutdown(incoming, stopped(stop.clone()));
        servers.push(runtime.spawn(fut));
    }
    let incoming = tonic::transport::server::TcpIncoming::from(tcp).with_nodelay(Some(true));
    servers
        .push(runtime.spawn(router.serve_with_incoming_shutdown(incoming, stopped(stop.clone()))));
    servers
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

async fn set_serving(health: &HealthReporter, serving: bool) {
    let status = if serving {
        ServingStatus::Serving
    } else {
        ServingStatus::NotServing
    };
    health.set_service_status("tulip.v1.Tulip", status).await;
    health.set_service_status("", status).await;
}

/// Waits for a signal (or a server failure) without holding the GIL.
fn wait_for_signal(py: Python<'_>, servers: &[ServerTask]) -> Result<(), String> {
    py.detach(|| loop {
        if servers.iter().any(|s| s.is_finished()) {
            return Err("the gRPC server stopped unexpectedly".to_string());
        }
        thread::sleep(SIGNAL_POLL);
        if let Err(e) = Python::attach(|py| py.check_signals()) {
            tracing::info!(signal = %e, "stopping");
            return Ok(());
        }
    })
}

fn wait_for_active(state: &ServiceState, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while state.active.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
    }
    let left = state.active.load(Ordering::SeqCst);
    if left > 0 {
        tracing::warn!(
            requests = left,
            "drain timeout: failing requests still in flight"
        );
    }
}

fn stop_task(runtime: &Runtime, server: ServerTask) {
    match runtime.block_on(async { tokio::time::timeout(SERVER_STOP, server).await }) {
        Ok(Ok(Err(e))) => tracing::warn!(error = %e, "gRPC server error"),
        Ok(Err(e)) => tracing::warn!(error = %e, "gRPC server task failed"),
        Err(_) => tracing::warn!("gRPC server did not stop in time"),
        Ok(Ok(Ok(()))) => {}
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> PyResult<thread::JoinHandle<()>> {
    thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start thread {name}: {e}")))
}

fn log_ready(model: &ModelInfo, addr: &SocketAddr, unix: Option<&str>) {
    tracing::info!(
        %addr,
        unix_socket = unix.unwrap_or("-"),
        model = %model.model_id,
        dimension = model.dimension,
        max_input_length = model.max_input_length,
        device = %model.device,
        "tulip serving"
    );
}
