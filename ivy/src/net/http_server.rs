//! Serving the HTTP router on Ivy's own accept loop (rather than
//! `axum::serve`, which exposes no timeouts): each connection gets the
//! deadlines of `conn_io.rs`, each request body the deadline of
//! `body_deadline.rs`, and at most `--max-connections` are open at once.
//! On shutdown: stop accepting, let each connection finish its request,
//! close idle ones, and return once all are closed.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::sync::watch;
use tower::ServiceExt;

use crate::net::body_deadline::TimedBody;
use crate::net::conn_io::{Activity, Watch};
use crate::net::listener::{Accepted, Listener};

/// Serves until `stop` turns true, then drains the open connections.
pub async fn serve(
    listener: Listener,
    router: Router,
    body_timeout: Duration,
    mut stop: watch::Receiver<bool>,
) -> Result<(), String> {
    loop {
        let accepted = tokio::select! {
            biased;
            () = stopped(&mut stop) => break,
            accepted = listener.accept() => accepted,
        };
        tokio::spawn(connection(
            accepted,
            router.clone(),
            body_timeout,
            stop.clone(),
        ));
    }
    listener.close().await;
    Ok(())
}

async fn connection(
    accepted: Accepted,
    router: Router,
    body_timeout: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let activity = Arc::new(Activity::default());
    let io = match accepted.open(Watch::Requests(Arc::clone(&activity))).await {
        Ok(io) => io,
        Err(e) => {
            tracing::debug!(error = %e, "connection closed before its first request");
            return;
        }
    };
    let service = hyper::service::service_fn(move |request: hyper::Request<Incoming>| {
        // Read deadlines pause while the request is handled.
        let busy = activity.enter();
        let request: Request =
            request.map(|body| axum::body::Body::new(TimedBody::new(body, body_timeout)));
        let call = router.clone().oneshot(request);
        async move {
            let response = call.await;
            drop(busy);
            response
        }
    });
    let conn =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let result = tokio::select! {
        r = conn.as_mut() => r,
        () = stopped(&mut stop) => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "connection closed");
    }
}

/// Resolves once `stop` turns true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}
