//! The Tulip replicas behind Ivy: each replica (its channel, health, load),
//! the set routed to now, how it is found (static or DNS) and checked, how
//! a replica is picked (balancing, batch slots), and how chunks travel
//! (coalescing, the frames client, the spinner that wakes on replies).

pub mod balancer;
pub mod batch_slots;
pub mod coalesce;
pub mod discovery;
mod frame_client;
pub mod health;
pub mod replica;
pub mod set;
pub mod spin;

use std::time::Duration;

use crate::error::ApiError;

/// How long connecting to a replica may take (gRPC channel or frames socket).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

pub fn no_replica() -> ApiError {
    ApiError::Unavailable("no healthy Tulip replica is available; retry shortly".into())
}
