//! The Tulip replicas behind Ivy: each replica (its channel, health, load),
//! the set routed to now, how it is found (static or DNS) and checked, how
//! a replica is picked (balancing, batch slots), and how chunks travel
//! (coalescing, the frames client, the spinner that wakes on replies).

pub mod balancer;
pub mod batch_slots;
pub mod coalesce;
pub mod cold_start;
pub mod discovery;
mod frame_client;
pub mod health;
pub mod replica;
pub mod set;
pub mod spin;

use std::time::Duration;

use crate::error::ApiError;
use self::set::ReplicaSet;

/// How long connecting to a replica may take (gRPC channel or frames socket).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The 503 when no replica takes work: each replica's reason (refused,
/// down, draining) and what to do, so the client sees what the logs say.
pub fn no_replica(set: &ReplicaSet) -> ApiError {
    const SHOWN: usize = 4;
    let replicas = set.snapshot();
    let mut reasons: Vec<String> = replicas
        .iter()
        .take(SHOWN)
        .map(|r| r.unavailable_reason())
        .collect();
    if replicas.len() > SHOWN {
        reasons.push(format!("and {} more", replicas.len() - SHOWN));
    }
    let detail = if reasons.is_empty() {
        "no replica is known yet (--tulip-dns has resolved none)".to_string()
    } else {
        reasons.join("; ")
    };
    ApiError::Unavailable(format!(
        "no healthy Tulip replica is available: {detail}. Retry shortly if a replica is starting"
    ))
}
