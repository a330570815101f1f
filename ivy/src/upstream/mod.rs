//! The Tulip replicas behind Ivy: each replica (its channel, health, load),
//! the set routed to now, how it is found (static or DNS) and checked, how
//! a replica is picked (balancing, batch slots), and how chunks travel
//! (coalescing, the frames client, the spinner that wakes on replies).

pub mod adapters;
pub mod balancer;
pub mod batch_slots;
pub mod coalesce;
pub mod cold_start;
pub mod discovery;
mod frame_client;
pub mod health;
pub mod pools;
pub mod replica;
pub mod set;
pub mod spin;

use std::time::Duration;

use self::set::ReplicaSet;
use crate::error::ApiError;

/// How long connecting to a replica may take (gRPC channel or frames socket).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The 503 when no replica takes work: each replica's reason (refused,
/// down, draining) and what to do, so the client sees what the logs say.
pub fn no_replica(set: &ReplicaSet) -> ApiError {
    no_replica_for(
        set.snapshot()
            .iter()
            .map(|r| r.unavailable_reason())
            .collect(),
        None,
    )
}

/// The 503 for `model` (a pool's, or any when `None`), from each replica's
/// reason.
pub fn no_replica_for(mut reasons: Vec<String>, model: Option<&str>) -> ApiError {
    const SHOWN: usize = 4;
    if reasons.len() > SHOWN {
        let more = reasons.len() - SHOWN;
        reasons.truncate(SHOWN);
        reasons.push(format!("and {more} more"));
    }
    let detail = if reasons.is_empty() {
        "no replica is known yet (--tulip-dns has resolved none)".to_string()
    } else {
        reasons.join("; ")
    };
    let which = match model {
        Some(m) => format!("Tulip replica of model `{m}`"),
        None => "Tulip replica".to_string(),
    };
    ApiError::Unavailable(format!(
        "no healthy {which} is available: {detail}. Retry shortly if a replica is starting"
    ))
}
