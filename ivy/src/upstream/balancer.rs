//! Which replica a chunk goes to. Policies sit behind one trait; the
//! default sends each chunk to the healthy replica with the fewest tokens in
//! flight, since time on a replica tracks tokens, not requests.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::config::Balance;
use crate::upstream::replica::Replica;

pub trait Policy: Send + Sync {
    /// Picks among routable `replicas`, avoiding those in `tried` (that
    /// already failed this chunk) unless no other is left.
    fn pick(&self, replicas: &[Arc<Replica>], tried: &[Arc<Replica>]) -> Option<Arc<Replica>>;
}

pub fn policy(kind: Balance) -> Box<dyn Policy> {
    match kind {
        Balance::LeastLoaded => Box::new(LeastLoaded::default()),
        Balance::RoundRobin => Box::new(RoundRobin::default()),
    }
}

/// The routable replicas not tried yet, or all routable ones if every one
/// was tried.
fn candidates<'a>(replicas: &'a [Arc<Replica>], tried: &[Arc<Replica>]) -> Vec<&'a Arc<Replica>> {
    let routable: Vec<&Arc<Replica>> = replicas.iter().filter(|r| r.is_routable()).collect();
    let fresh: Vec<&Arc<Replica>> = routable
        .iter()
        .copied()
        .filter(|r| !tried.iter().any(|t| Arc::ptr_eq(t, r)))
        .collect();
    if fresh.is_empty() {
        routable
    } else {
        fresh
    }
}

/// Fewest tokens in flight; ties go round the replicas so equal loads
/// (an idle cluster) still spread.
#[derive(Default)]
pub struct LeastLoaded {
    rotor: AtomicUsize,
}

impl Policy for LeastLoaded {
    fn pick(&self, replicas: &[Arc<Replica>], tried: &[Arc<Replica>]) -> Option<Arc<Replica>> {
        let c = candidates(replicas, tried);
        if c.is_empty() {
            return None;
        }
        let start = self.rotor.fetch_add(1, Ordering::Relaxed) % c.len();
        (0..c.len())
            .map(|i| c[(start + i) % c.len()])
            .min_by_key(|r| r.inflight_tokens())
            .cloned()
    }
}

/// Replicas in turn, whatever their load.
#[derive(Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

impl Policy for RoundRobin {
    fn pick(&self, replicas: &[Arc<Replica>], tried: &[Arc<Replica>]) -> Option<Arc<Replica>> {
        let c = candidates(replicas, tried);
        if c.is_empty() {
            return None;
        }
        Some(Arc::clone(
            c[self.next.fetch_add(1, Ordering::Relaxed) % c.len()],
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::replica::Health;

    fn replicas(n: usize) -> Vec<Arc<Replica>> {
        (0..n)
            .map(|i| {
                let r = Arc::new(
                    Replica::new(&format!("http://127.0.0.1:{}", 9000 + i), false).unwrap(),
                );
                r.set_health(Health::Serving, "test", false);
                r
            })
            .collect()
    }

    #[tokio::test]
    async fn least_loaded_skips_unhealthy_and_tried_replicas() {
        let rs = replicas(3);
        rs[0].set_health(Health::Down, "test", false);
        let p = LeastLoaded::default();
        for _ in 0..10 {
            let got = p.pick(&rs, &[Arc::clone(&rs[1])]).unwrap();
            assert!(Arc::ptr_eq(&got, &rs[2]));
        }
        // Every routable replica tried: fall back to them.
        let got = p
            .pick(&rs, &[Arc::clone(&rs[1]), Arc::clone(&rs[2])])
            .unwrap();
        assert!(!Arc::ptr_eq(&got, &rs[0]));
        rs[1].set_health(Health::Draining, "test", false);
        rs[2].set_health(Health::Down, "test", false);
        assert!(p.pick(&rs, &[]).is_none());
    }

    #[tokio::test]
    async fn least_loaded_picks_the_fewest_tokens_in_flight() {
        let rs = replicas(3);
        for (r, load) in rs.iter().zip([300, 20, 150]) {
            r.add_load(load);
        }
        let p = LeastLoaded::default();
        for _ in 0..6 {
            assert!(Arc::ptr_eq(&p.pick(&rs, &[]).unwrap(), &rs[1]));
        }
        assert!(Arc::ptr_eq(
            &p.pick(&rs, &[Arc::clone(&rs[1])]).unwrap(),
            &rs[2]
        ));
    }

    #[tokio::test]
    async fn ties_rotate_and_round_robin_cycles() {
        let rs = replicas(3);
        let ll = LeastLoaded::default();
        let rr = RoundRobin::default();
        for p in [&ll as &dyn Policy, &rr] {
            let mut seen: Vec<String> = (0..3)
                .map(|_| p.pick(&rs, &[]).unwrap().url.clone())
                .collect();
            seen.sort();
            seen.dedup();
            assert_eq!(seen.len(), 3);
        }
    }
}
