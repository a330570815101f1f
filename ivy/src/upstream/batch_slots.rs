//! A bound on the batch-priority work in flight on each replica: chunks'
//! worth of tokens (`--batch-chunks-per-replica` x `--chunk-tokens`), each
//! chunk counted by its tokens (at most a full chunk's), so many small
//! batch requests (the Batch API's lines, one document each) fill a
//! replica's steps as a few full chunks would. Replicas already run
//! interactive work first; the bound keeps indexing clients from piling
//! their work into every replica's queue (memory, and a least-loaded pick
//! that sees every replica full), and batch work that finds every replica
//! at the bound waits here, in Ivy. A chunk finding its replica empty goes
//! whatever its size. Without a chunk budget (`--chunk-tokens 0`), chunks
//! are counted one each.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::Notify;

use crate::upstream::balancer::Policy;
use crate::upstream::replica::Replica;

pub struct BatchSlots {
    /// Per replica, in tokens (or chunks without a chunk budget); 0 = no
    /// bound.
    limit: usize,
    /// The most one chunk counts for: a full chunk (1 without a budget).
    chunk: usize,
    freed: Notify,
}

/// A held share of `replica`'s bound, given back on drop.
pub struct Slot<'a> {
    slots: &'a BatchSlots,
    replica: Arc<Replica>,
    weight: usize,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.replica
            .batch_load
            .fetch_sub(self.weight, Ordering::AcqRel);
        self.slots.freed.notify_waiters();
    }
}

impl BatchSlots {
    /// `chunks` chunks' worth per replica, a chunk being `chunk_tokens`
    /// tokens (0: chunks are counted one each).
    pub fn new(chunks: usize, chunk_tokens: usize) -> Self {
        let chunk = chunk_tokens.max(1);
        Self {
            limit: chunks * chunk,
            chunk,
            freed: Notify::new(),
        }
    }

    /// What a chunk of `tokens` counts for.
    fn weight(&self, tokens: usize) -> usize {
        if self.chunk == 1 {
            1
        } else {
            tokens.clamp(1, self.chunk)
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
        tokens: usize,
    ) -> Option<(Arc<Replica>, Slot<'_>)> {
        let weight = self.weight(tokens);
        loop {
            // Registered before looking, so a slot freed in between wakes us.
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let all = replicas();
            let open: Vec<Arc<Replica>> = all
                .iter()
                .filter(|r| self.fits(r.batch_load.load(Ordering::Acquire), weight))
                .cloned()
                .collect();
            match policy.pick(&open, tried) {
                Some(r) => {
                    if self.take(&r, weight) {
                        return Some((
                            Arc::clone(&r),
                            Slot {
                                slots: self,
                                replica: r,
                                weight,
                            },
                        ));
                    }
                    continue; // raced with another chunk for its last room
                }
                None if policy.pick(&all, tried).is_none() => return None,
                None => freed.await,
            }
        }
    }

    /// Whether `weight` more fits beside `load`: within the bound, or
    /// alone on an idle replica.
    fn fits(&self, load: usize, weight: usize) -> bool {
        load == 0 || load + weight <= self.limit
    }

    fn take(&self, replica: &Replica, weight: usize) -> bool {
        replica
            .batch_load
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                self.fits(n, weight).then_some(n + weight)
            })
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_chunks_count_their_tokens_and_a_large_one_goes_alone() {
        let s = BatchSlots::new(4, 2048);
        assert_eq!(s.weight(30), 30);
        assert_eq!(s.weight(5000), 2048);
        // 4 chunks' worth: 273 one-document requests of 30 tokens fit.
        assert!(s.fits(272 * 30, 30) && !s.fits(273 * 30, 30));
        assert!(s.fits(0, 2048) && !s.fits(1, 8192));
        let chunks = BatchSlots::new(4, 0);
        assert_eq!(chunks.weight(5000), 1);
        assert!(chunks.fits(3, 1) && !chunks.fits(4, 1));
    }
}
