//! Health checks of the replicas (`grpc.health.v1`), every interval and at
//! once when replicas are added. SERVING admits a replica (after its `Info`
//! puts it in its model's pool, `pools.rs`, and matches that pool's model), NOT_SERVING (a draining Tulip) stops new work but lets
//! in-flight chunks finish, and repeated failures take it out and make its
//! in-flight chunks retry elsewhere.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use proto::tulip::v1::InfoResponse;

use super::pools::Pools;
use super::replica::{Health, Replica};

/// Failed checks in a row that take a serving replica out. One failure may be
/// a hiccup; a dead replica also fails its calls, which takes it out at once.
const FAILURES_TO_DOWN: u32 = 2;

pub fn spawn(pools: Arc<Pools>, interval: Duration) {
    // A check may take up to a second longer than the interval, never less.
    let timeout = interval.max(Duration::from_secs(1));
    tokio::spawn(async move {
        loop {
            let replicas = pools.set().snapshot();
            let answers = join_all(replicas.iter().map(|r| check(r, timeout))).await;
            // Admitted in the set's order (`--tulip`'s), not the order they
            // answered in: with no `--default-model`, the first pool is the
            // first listed replica's model when they come up together.
            for (replica, info) in replicas.iter().zip(answers) {
                if let Some(info) = info {
                    admit(&pools, replica, &info);
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = pools.set().added.notified() => {}
            }
        }
    });
}

/// Probes a replica; its `Info` when it is SERVING.
async fn check(replica: &Arc<Replica>, timeout: Duration) -> Option<Arc<InfoResponse>> {
    match replica.probe(timeout).await {
        Ok(true) => match replica.info() {
            Some(info) => Some(info),
            None => match replica.fetch_info(timeout).await {
                Ok(info) => Some(info),
                Err(e) => {
                    replica.set_health(Health::Down, &e, false);
                    None
                }
            },
        },
        Ok(false) => {
            replica.set_health(Health::Draining, "NOT_SERVING", false);
            None
        }
        Err(e) => {
            let failures = replica.failed_check();
            if failures >= FAILURES_TO_DOWN || replica.health() != Health::Serving {
                replica.set_health(Health::Down, &e, true);
            }
            None
        }
    }
}

fn admit(pools: &Pools, replica: &Arc<Replica>, info: &Arc<InfoResponse>) {
    match pools.accept(replica, info) {
        Ok(pool) => {
            replica.set_health(Health::Serving, "health check", false);
            super::adapters::catch_up(&pool.adapters, replica);
        }
        Err(why) => {
            if replica.health() != Health::Mismatch {
                tracing::error!(replica = %replica.url, model = %info.model_id, reason = %why,
                                "replica refused; not routing to it");
            }
            replica.set_health(Health::Mismatch, &why, false);
        }
    }
}
