//! Start-up and shutdown: build the shared state, start discovery, health
//! checks and template watchers, serve HTTP and gRPC, and on SIGTERM drain:
//! refuse new work, let in-flight requests finish (up to --drain-timeout),
//! then exit.

use std::sync::Arc;

use ivy_tokenizer::Tokenizer;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::model::templates::TemplateStore;
use crate::net::http_server;
use crate::net::listener::Listener;
use crate::net::tls::{self, Alpn};
use crate::request::admission::Admission;
use crate::request::auth::ApiKey;
use crate::state::{AppState, Gateway};
use crate::upstream::discovery::{self, Source};
use crate::upstream::health;
use crate::upstream::pools::{Pools, Settings};
use crate::upstream::set::ReplicaSet;
use crate::{grpc, http};

pub async fn run(config: Config) -> Result<(), String> {
    let metrics = Arc::new(Metrics::new());
    let templates = Arc::new(TemplateStore::open(
        config.config.clone(),
        Arc::clone(&metrics),
    )?);
    let replicas = Arc::new(ReplicaSet::new(config.unix_frames));
    let pools = Arc::new(Pools::new(
        Arc::clone(&replicas),
        Settings {
            balance: config.balance,
            batch_chunks_per_replica: config.batch_chunks_per_replica,
            chunk_tokens: config.chunk_tokens,
            default_model: config.default_model.clone(),
            tokenizer: tokenizer_override(&config)?,
            served_model_name: config.served_model_name.clone(),
        },
    ));
    watch_replicas(&config, &pools).await?;
    templates.spawn_watchers();
    let (http_listener, grpc_listener) = listeners(&config).await?;
    tracing::info!(
        http = %format!("{}:{}", config.host, config.port),
        grpc = %format!("{}:{}", config.host, config.grpc_port),
        replicas = ?config.tulip, dns = ?config.tulip_dns, default_model = ?config.default_model, balance = ?config.balance,
        chunk_tokens = config.chunk_tokens, api_key = !config.api_key.is_empty() || config.api_key_file.is_some(),
        batch_store = %config.batch.describe(), batch_dir = ?config.batch.batch_dir,
        tls = config.net.tls_cert.is_some(), max_connections = config.net.max_connections, "ivy listening"
    );
    let spinner =
        crate::upstream::spin::Spinner::new(std::time::Duration::from_micros(config.busy_poll_us));
    if config.busy_poll_us > 0 {
        tokio::spawn(Arc::clone(&spinner).run());
    }
    let state = Arc::new(Gateway {
        admission: Admission::new(config.max_concurrent_requests),
        api_key: ApiKey::new(config.api_keys()?),
        batches: crate::batch::Batches::open(&config.batch, Arc::clone(&metrics))?,
        replicas,
        pools,
        templates,
        metrics,
        spinner,
        image_prep: Arc::new(tokio::sync::Semaphore::new(config.images.prep_threads())),
        started_unix: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        config,
    });
    serve(state, http_listener, grpc_listener).await
}

/// The `--tokenizer` file, when given: requests are tokenized with it
/// rather than with the one the replicas serve.
fn tokenizer_override(config: &Config) -> Result<Option<Arc<Tokenizer>>, String> {
    let Some(path) = &config.tokenizer else {
        return Ok(None);
    };
    let t = Tokenizer::from_file(path).map_err(|e| e.to_string())?;
    // Names the in-house model, or why the file fell back to `tokenizers`.
    tracing::info!(path = %path.display(), backend = %t.backend(), "tokenizer loaded (--tokenizer override)");
    Ok(Some(Arc::new(t)))
}

/// Finds the replicas (`--tulip` or `--tulip-dns`) and checks their health,
/// accepting the model they serve.
async fn watch_replicas(config: &Config, pools: &Arc<Pools>) -> Result<(), String> {
    let source = if config.tulip_dns.is_empty() {
        Source::Static(config.tulip.clone())
    } else {
        Source::Dns {
            targets: config.tulip_dns.clone(),
            interval: config.dns_interval,
        }
    };
    discovery::start(source, pools.set_arc()).await?;
    health::spawn(Arc::clone(pools), config.health_interval);
    Ok(())
}

/// The HTTP and gRPC listeners, with TLS when a certificate is given.
async fn listeners(config: &Config) -> Result<(Listener, Listener), String> {
    let net = &config.net;
    let (http_tls, grpc_tls) = match (&net.tls_cert, &net.tls_key) {
        (Some(cert), Some(key)) => (
            Some(tls::acceptor(cert, key, Alpn::Http1)?),
            Some(tls::acceptor(cert, key, Alpn::H2)?),
        ),
        _ => (None, None),
    };
    let http = Listener::new(
        bind(&config.host, config.port, "--port").await?,
        http_tls,
        net.max_connections,
        net.timeouts(),
        "http",
    );
    let grpc = Listener::new(
        bind(&config.host, config.grpc_port, "--grpc-port").await?,
        grpc_tls,
        net.max_connections,
        net.timeouts(),
        "grpc",
    );
    Ok((http, grpc))
}

/// Serves HTTP and gRPC until a signal, then drains: refuses new work and
/// lets in-flight requests finish, up to --drain-timeout.
async fn serve(
    state: AppState,
    http_listener: Listener,
    grpc_listener: Listener,
) -> Result<(), String> {
    if let Some(b) = &state.batches {
        b.start(http::batch_router(Arc::clone(&state)));
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let mut http = tokio::spawn(http_server::serve(
        http_listener,
        http::router(Arc::clone(&state)),
        state.config.net.body_timeout,
        stop_rx.clone(),
    ));
    let mut grpc = tokio::spawn(grpc::serve(
        Arc::clone(&state),
        grpc_listener.incoming(stopped(stop_rx.clone())),
        stopped(stop_rx),
    ));

    tokio::select! {
        _ = shutdown_signal() => {}
        r = &mut http => return Err(format!("the HTTP server stopped: {r:?}")),
        r = &mut grpc => return Err(format!("the gRPC server stopped: {r:?}")),
    }
    let in_flight = state.admission.in_flight();
    tracing::info!(in_flight, timeout = ?state.config.drain_timeout, "draining: refusing new work, finishing in-flight requests");
    state.admission.start_draining();
    if let Some(b) = &state.batches {
        b.stop();
    }
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(state.config.drain_timeout, async {
        let _ = http.await;
        let _ = grpc.await;
    })
    .await;
    match drained {
        Ok(()) => tracing::info!("drained; exiting"),
        Err(_) => tracing::warn!(
            in_flight = state.admission.in_flight(),
            "drain timeout; exiting with requests in flight"
        ),
    }
    Ok(())
}

/// Binds `flag`'s listener; the error names the flag to change.
async fn bind(host: &str, port: u16, flag: &str) -> Result<TcpListener, String> {
    let addr = format!("{host}:{port}");
    TcpListener::bind(&addr)
        .await
        .map_err(|e| format!("cannot listen on {addr} ({flag}): {e}; pass another {flag}"))
}

/// Resolves on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
