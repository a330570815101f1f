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
use tokio::sync::oneshot;
use tonic_health::ServingStatus;

use crate::config::ServeConfig;
use crate::engine::{EngineHandle, ModelInfo};
use crate::metrics::Metrics;
use crate::queue::Pool;
use crate::service::{ServiceState, TulipService};
use crate::validate::Limits;
use crate::{completion, metrics_http, scheduler};

/// How often the waiting main thread looks for Python signals.
const SIGNAL_POLL: Duration = Duration::from_millis(100);
/// How long the gRPC server may take to close its connections at the end.
const SERVER_STOP: Duration = Duration::from_secs(5);

pub fn serve(
    py: Python<'_>,
    engine: Py<PyAny>,
    batch_type: Py<PyAny>,
    config: ServeConfig,
) -> PyResult<()> {
    config.check().map_err(PyValueError::new_err)?;
    let engine = EngineHandle::new(engine, batch_type);
    let model = Arc::new(engine.info(py)?);
    if (model.max_input_length as usize) > config.max_batch_tokens {
        tracing::warn!(
            max_input_length = model.max_input_length,
            max_batch_tokens = config.max_batch_tokens,
            "a single long sequence may exceed the batch token budget; it runs alone"
        );
    }
    let addr: SocketAddr = format!("{}:{}", config.host, config.port)
        .parse()
        .map_err(|e| {
            PyValueError::new_err(format!(
                "invalid listen address {}:{}: {e}",
                config.host, config.port
            ))
        })?;

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("tulip-io")
        .build()
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start the async runtime: {e}")))?;
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(addr))
        .map_err(|e| PyOSError::new_err(format!("cannot listen on {addr}: {e}")))?;

    let metrics_listener = match config.metrics_port {
        0 => None,
        port => {
            let addr = SocketAddr::new(addr.ip(), port);
            Some(
                runtime
                    .block_on(tokio::net::TcpListener::bind(addr))
                    .map_err(|e| {
                        PyOSError::new_err(format!("cannot listen on {addr} (metrics): {e}"))
                    })?,
            )
        }
    };
    let metrics = Metrics::new();
    let pool = Arc::new(Pool::new(
        config.max_batch_tokens,
        config.max_batch_sequences,
        config.max_inflight,
    ));
    let (done_tx, done_rx) = mpsc::channel();
    let threads = [
        spawn("tulip-scheduler", {
            let pool = Arc::clone(&pool);
            let metrics = Arc::clone(&metrics);
            move || scheduler::run(pool, engine, done_tx, metrics)
        })?,
        spawn("tulip-completion", {
            let pool = Arc::clone(&pool);
            let metrics = Arc::clone(&metrics);
            move || completion::run(pool, done_rx, metrics)
        })?,
    ];

    let state = Arc::new(ServiceState::default());
    let service = TulipService {
        pool: Arc::clone(&pool),
        model: Arc::clone(&model),
        limits: Limits {
            max_request_sequences: config.max_request_sequences,
        },
        state: Arc::clone(&state),
        metrics: Arc::clone(&metrics),
    };
    let (health, health_service) = tonic_health::server::health_reporter();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    // The metrics server outlives the gRPC drain, so the drain is observable.
    let (metrics_stop_tx, metrics_stop_rx) = oneshot::channel::<()>();
    let metrics_server = metrics_listener.map(|listener| {
        runtime.spawn(metrics_http::serve(listener, Arc::clone(&metrics), async {
            let _ = metrics_stop_rx.await;
        }))
    });
    let server = runtime.spawn({
        let health = health.clone();
        let max = config.max_message_bytes;
        async move {
            health.set_serving::<TulipServer<TulipService>>().await;
            health.set_service_status("", ServingStatus::Serving).await;
            tonic::transport::Server::builder()
                .tcp_nodelay(true)
                .add_service(health_service)
                .add_service(
                    TulipServer::new(service)
                        .max_decoding_message_size(max)
                        .max_encoding_message_size(usize::MAX),
                )
                .serve_with_incoming_shutdown(
                    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true)),
                    async {
                        let _ = stop_rx.await;
                    },
                )
                .await
        }
    });
    log_ready(&model, addr);

    // Wait for a signal (or a server failure) without holding the GIL.
    let outcome = py.detach(|| loop {
        if server.is_finished() {
            return Err("the gRPC server stopped unexpectedly".to_string());
        }
        thread::sleep(SIGNAL_POLL);
        if let Err(e) = Python::attach(|py| py.check_signals()) {
            tracing::info!(signal = %e, "stopping");
            return Ok(());
        }
    });

    // Drain: refuse new work, let in-flight requests finish, then stop.
    state.draining.store(true, Ordering::SeqCst);
    metrics.draining.set(1);
    runtime.block_on(async {
        health.set_not_serving::<TulipServer<TulipService>>().await;
        health
            .set_service_status("", ServingStatus::NotServing)
            .await;
    });
    py.detach(|| {
        let deadline = Instant::now() + config.drain_timeout;
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
        let _ = stop_tx.send(());
        pool.shutdown();
        for t in threads {
            let _ = t.join();
        }
        match runtime.block_on(async { tokio::time::timeout(SERVER_STOP, server).await }) {
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "gRPC server error"),
            Ok(Err(e)) => tracing::warn!(error = %e, "gRPC server task failed"),
            Err(_) => tracing::warn!("gRPC server did not stop in time"),
            Ok(Ok(Ok(()))) => {}
        }
        let _ = metrics_stop_tx.send(());
        if let Some(m) = metrics_server {
            let _ = runtime.block_on(async { tokio::time::timeout(SERVER_STOP, m).await });
        }
        runtime.shutdown_timeout(Duration::from_secs(1));
    });
    // Outputs that completed after the scheduler stopped.
    for output in pool.take_releases() {
        EngineHandle::release(py, output);
    }
    tracing::info!("stopped");
    outcome.map_err(PyRuntimeError::new_err)
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> PyResult<thread::JoinHandle<()>> {
    thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map_err(|e| PyRuntimeError::new_err(format!("cannot start thread {name}: {e}")))
}

fn log_ready(model: &ModelInfo, addr: SocketAddr) {
    tracing::info!(
        %addr,
        model = %model.model_id,
        dimension = model.dimension,
        max_input_length = model.max_input_length,
        device = %model.device,
        "tulip serving"
    );
}
