//! Health checks of the replicas (`grpc.health.v1`), every interval and at
//! once when replicas are added. SERVING admits a replica (after its `Info`
//! matches the model), NOT_SERVING (a draining Tulip) stops new work but lets
//! in-flight chunks finish, and repeated failures take it out and make its
//! in-flight chunks retry elsewhere.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;

use super::replica::{Health, Replica};
use super::set::ReplicaSet;
use crate::model::ServedModel;

/// Failed checks in a row that take a serving replica out. One failure may be
/// a hiccup; a dead replica also fails its calls, which takes it out at once.
const FAILURES_TO_DOWN: u32 = 2;

pub fn spawn(set: Arc<ReplicaSet>, model: Arc<ServedModel>, interval: Duration) {
    // A check may take up to a second longer than the interval, never less.
    let timeout = interval.max(Duration::from_secs(1));
    tokio::spawn(async move {
        loop {
            let replicas = set.snapshot();
            join_all(replicas.iter().map(|r| check(&model, r, timeout))).await;
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = set.added.notified() => {}
            }
        }
    });
}

async fn check(model: &ServedModel, replica: &Arc<Replica>, timeout: Duration) {
    match replica.probe(timeout).await {
        Ok(true) => {
            let info = match replica.info() {
                Some(info) => info,
                None => match replica.fetch_info(timeout).await {
                    Ok(info) => info,
                    Err(e) => {
                        replica.set_health(Health::Down, &e, false);
                        return;
                    }
                },
            };
            match model.accept(&info) {
                Ok(()) => replica.set_health(Health::Serving, "health check", false),
                Err(why) => {
                    if replica.health() != Health::Mismatch {
                        tracing::error!(replica = %replica.url, model = %info.model_id, reason = %why,
                                        "replica refused; not routing to it");
                    }
                    replica.set_health(Health::Mismatch, &why, false);
                }
            }
        }
        Ok(false) => replica.set_health(Health::Draining, "NOT_SERVING", false),
        Err(e) => {
            let failures = replica.failed_check();
            if failures >= FAILURES_TO_DOWN || replica.health() != Health::Serving {
                replica.set_health(Health::Down, &e, true);
            }
        }
    }
}
