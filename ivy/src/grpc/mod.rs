//! The gRPC front: `ivy.v1.Ivy` (`service.rs`: the same pipeline as the
//! HTTP routes) and `grpc.health.v1` (`health.rs`). Errors map to gRPC codes
//! in `error.rs`; the request id travels in `x-request-id` metadata.

mod convert;
mod embed;
mod health;
mod quantized;
mod service;

use std::future::Future;

use proto::ivy::v1::ivy_server::IvyServer;

use self::service::IvyService;
use crate::net::conn_io::ConnIo;
use crate::net::tls::Stream;
use crate::state::AppState;

/// Serves until `shutdown` resolves, then finishes in-flight calls. HTTP/2
/// keepalive pings close connections whose peer stopped answering (or
/// reading): quiet for --idle-timeout, unanswered for --write-timeout.
pub async fn serve(
    state: AppState,
    incoming: impl futures_util::Stream<Item = std::io::Result<ConnIo<Stream>>> + Send + 'static,
    shutdown: impl Future<Output = ()>,
) -> Result<(), String> {
    let max = state.config.max_body_bytes;
    let net = state.config.net.clone();
    let drain_timeout = state.config.drain_timeout;
    let health = health::service(state.clone());
    let service = IvyServer::new(IvyService::new(state))
        .max_decoding_message_size(max)
        .max_encoding_message_size(usize::MAX);
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(net.idle_timeout))
        .http2_keepalive_timeout(Some(net.write_timeout));
    if let Some(age) = net.grpc_max_connection_age {
        builder = builder
            .max_connection_age(age)
            .max_connection_age_grace(drain_timeout);
    }
    builder
        .add_service(health)
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, shutdown)
        .await
        .map_err(|e| format!("gRPC server error: {e}"))
}
