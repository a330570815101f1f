//! Ivy: the HTTP gateway. Parses and validates requests, tokenizes, and sends
//! token ids to the least-loaded healthy Tulip replica.

mod app;
mod body;
mod config;
mod embed;
mod error;
mod openai;
mod replicas;
mod tokenize;

use std::sync::Arc;

use clap::Parser;
use ivy_tokenizer::Tokenizer;
use tracing_subscriber::EnvFilter;

use crate::app::AppState;
use crate::config::Config;
use crate::replicas::Replicas;

fn main() -> std::process::ExitCode {
    let config = Config::parse();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_new(&config.log).unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(config)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(config: Config) -> Result<(), String> {
    let tokenizer = Tokenizer::from_file(&config.tokenizer).map_err(|e| e.to_string())?;
    let replicas = Arc::new(Replicas::new(&config.tulip)?);
    replicas.spawn_health_checks(config.health_interval);
    let addr = format!("{}:{}", config.host, config.port);
    let listener = tokio::net::TcpListener::bind(&addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    tracing::info!(%addr, replicas = ?config.tulip, "ivy listening");
    let state = AppState {
        config: Arc::new(config),
        tokenizer: Arc::new(tokenizer),
        replicas,
    };
    axum::serve(listener, app::router(state))
        .with_graceful_shutdown(shutdown_signal())
        .await
        .map_err(|e| format!("server error: {e}"))
}

/// Resolves on Ctrl-C or SIGTERM.
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
    tracing::info!("shutting down");
}
