//! A bound on the chunks of batch-priority requests in flight on each
//! replica. Replicas already run interactive work first; the bound keeps
//! indexing clients from piling their chunks into every replica's queue
//! (memory, and a least-loaded pick that sees every replica full), and a
//! batch chunk that finds every replica at the bound waits here, in Ivy.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::Notify;

use crate::upstream::balancer::Policy;
use crate::upstream::replica::Replica;

pub struct BatchSlots {
    /// Per replica; 0 = no bound.
    limit: usize,
    freed: Notify,
}

/// A held slot on `replica`, given back on drop.
pub struct Slot<'a> {
    slots: &'a BatchSlots,
    replica: Arc<Replica>,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.replica.batch_chunks.fetch_sub(1, Ordering::AcqRel);
        self.slots.freed.notify_waiters();
    }
}

impl BatchSlots {
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            freed: Notify::new(),
        }
    }

    pub fn bounded(&self) -> bool {
        self.limit > 0
    }

    /// The replica `policy` picks among those with a free slot, with the
    /// slot taken; waits while every replica is at the bound. `None` when
    /// `policy` would pick no replica at all (none routable).
    pub async fn pick(
        &self,
        replicas: impl Fn() -> Arc<Vec<Arc<Replica>>>,
        policy: &dyn Policy,
        tried: &[Arc<Replica>],
    ) -> Option<(Arc<Replica>, Slot<'_>)> {
        loop {
            // Registered before looking, so a slot freed in between wakes us.
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let all = replicas();
            let open: Vec<Arc<Replica>> = all
                .iter()
                .filter(|r| r.batch_chunks.load(Ordering::Acquire) < self.limit)
                .cloned()
                .collect();
            match policy.pick(&open, tried) {
                Some(r) => {
                    if self.take(&r) {
                        return Some((
                            Arc::clone(&r),
                            Slot {
                                slots: self,
                                replica: r,
                            },
                        ));
                    }
                    continue; // raced with another chunk for its last slot
                }
                None if policy.pick(&all, tried).is_none() => return None,
                None => freed.await,
            }
        }
    }

    fn take(&self, replica: &Replica) -> bool {
        replica
            .batch_chunks
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.limit).then_some(n + 1)
            })
            .is_ok()
    }
}
