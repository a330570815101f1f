//! Request ids: taken from the caller's `x-request-id` when it is sane,
//! generated otherwise; carried in a task-local so every stage, log line and
//! error message of a request can name it, and sent on to Tulip.

use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

/// The header that carries the id, in requests and responses (HTTP and gRPC
/// metadata alike).
pub const HEADER: &str = "x-request-id";

/// Longest caller-supplied id that is accepted as is.
const MAX_LEN: usize = 128;

tokio::task_local! {
    static CURRENT: RequestId;
    /// The model pool serving the request, once known: its metric label.
    static MODEL: std::cell::RefCell<Option<Arc<str>>>;
    /// The LoRA adapter the request named as its model, if any: what the
    /// replicas are asked to apply (`pipeline::infer`).
    static ADAPTER: std::cell::RefCell<Option<Arc<str>>>;
}

/// Records that the current request runs with LoRA adapter `name` (a name
/// the gateway serves: bounded), also its metric label; false outside a
/// request (nothing would carry the adapter to the replicas).
pub fn set_adapter(name: &str) -> bool {
    let name: Arc<str> = Arc::from(name);
    let set = ADAPTER
        .try_with(|a| *a.borrow_mut() = Some(Arc::clone(&name)))
        .is_ok();
    set_model_label(&name);
    set
}

/// The current request's adapter ("" for the base model).
pub fn adapter() -> String {
    ADAPTER
        .try_with(|a| a.borrow().as_deref().map(str::to_owned))
        .ok()
        .flatten()
        .unwrap_or_default()
}

/// Records the pool serving the current request (a pool name: bounded).
pub fn set_model_label(name: &Arc<str>) {
    let _ = MODEL.try_with(|m| *m.borrow_mut() = Some(Arc::clone(name)));
}

/// The current request's model label: its pool, or `none` (refused before
/// a model was chosen, or a route that uses none).
pub fn model_label() -> Arc<str> {
    MODEL
        .try_with(|m| m.borrow().clone())
        .ok()
        .flatten()
        .unwrap_or_else(|| Arc::from("none"))
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestId(Arc<str>);

impl RequestId {
    /// The caller's id when it is short printable ASCII without spaces
    /// (safe in headers and logs), a fresh one otherwise.
    pub fn from_caller(value: Option<&[u8]>) -> Self {
        match value {
            Some(v)
                if !v.is_empty()
                    && v.len() <= MAX_LEN
                    && v.iter().all(|b| b.is_ascii_graphic()) =>
            {
                Self(Arc::from(std::str::from_utf8(v).unwrap_or_default()))
            }
            _ => Self::generate(),
        }
    }

    /// 16 hex digits: a per-process random seed mixed with a counter, so ids
    /// are unique within a process and unlikely to repeat across replicas.
    pub fn generate() -> Self {
        static SEED: OnceLock<u64> = OnceLock::new();
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let seed = *SEED.get_or_init(|| {
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
        });
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        Self(Arc::from(format!(
            "{:016x}",
            splitmix64(seed.wrapping_add(n))
        )))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id of the request this task is serving, if any.
    pub fn current() -> Option<Self> {
        CURRENT.try_with(Clone::clone).ok()
    }

    /// Runs `fut` as part of this request.
    pub async fn scope<F: Future>(self, fut: F) -> F::Output {
        CURRENT
            .scope(
                self,
                MODEL.scope(Default::default(), ADAPTER.scope(Default::default(), fut)),
            )
            .await
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_sane_caller_ids_and_replaces_others() {
        assert_eq!(RequestId::from_caller(Some(b"abc-123")).as_str(), "abc-123");
        for bad in [
            &b""[..],
            b"has space",
            b"new\nline",
            &[b'x'; 200],
            "é".as_bytes(),
        ] {
            let id = RequestId::from_caller(Some(bad));
            assert_eq!(id.as_str().len(), 16, "{bad:?}");
        }
    }

    #[test]
    fn generated_ids_differ() {
        let a = RequestId::generate();
        let b = RequestId::generate();
        assert_ne!(a, b);
    }

    #[tokio::test]
    async fn current_is_scoped() {
        assert!(RequestId::current().is_none());
        let id = RequestId::from_caller(Some(b"r1"));
        let seen = id.clone().scope(async { RequestId::current() }).await;
        assert_eq!(seen, Some(id.clone()));
        let label = id
            .scope(async {
                let before = model_label();
                set_model_label(&Arc::from("m"));
                (before, model_label())
            })
            .await;
        assert_eq!((&*label.0, &*label.1), ("none", "m"));
        assert_eq!(&*model_label(), "none");
    }
}
