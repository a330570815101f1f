//! `grpc.health.v1` for Ivy's gRPC port, answered from Ivy's readiness at
//! the moment of the call (not drained, at least one healthy replica), so it
//! always agrees with `GET /ready`.

use std::pin::Pin;
use std::time::Duration;

use futures_util::stream::{self, Stream};
use tonic::{Request, Response, Status};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};

use crate::state::AppState;

/// Services this health endpoint answers for: the server as a whole ("")
/// and `ivy.v1.Ivy`.
const SERVICES: [&str; 2] = ["", "ivy.v1.Ivy"];

/// How often a `Watch` stream looks for a change.
const WATCH_POLL: Duration = Duration::from_millis(200);

pub fn service(state: AppState) -> HealthServer<ReadinessHealth> {
    HealthServer::new(ReadinessHealth { state })
}

pub struct ReadinessHealth {
    state: AppState,
}

fn status(state: &AppState) -> i32 {
    if state.is_ready() {
        ServingStatus::Serving as i32
    } else {
        ServingStatus::NotServing as i32
    }
}

fn known(request: &HealthCheckRequest) -> Result<(), Status> {
    if SERVICES.contains(&request.service.as_str()) {
        Ok(())
    } else {
        Err(Status::not_found(format!(
            "unknown service `{}`",
            request.service
        )))
    }
}

type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

#[tonic::async_trait]
impl Health for ReadinessHealth {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        known(request.get_ref())?;
        Ok(Response::new(HealthCheckResponse {
            status: status(&self.state),
        }))
    }

    type WatchStream = WatchStream;

    /// The current status at once, then every change.
    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        known(request.get_ref())?;
        let state = self.state.clone();
        let changes = stream::unfold(None, move |last: Option<i32>| {
            let state = state.clone();
            async move {
                loop {
                    let now = status(&state);
                    if last != Some(now) {
                        return Some((Ok(HealthCheckResponse { status: now }), Some(now)));
                    }
                    tokio::time::sleep(WATCH_POLL).await;
                }
            }
        });
        Ok(Response::new(Box::pin(changes)))
    }
}
