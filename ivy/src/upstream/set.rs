//! The replicas Ivy knows now (static or discovered): membership changes
//! keep the replicas (and their connections and load) that stay.

use std::sync::{Arc, RwLock};

use tokio::sync::Notify;

use super::replica::Replica;

#[derive(Default)]
pub struct ReplicaSet {
    list: RwLock<Arc<Vec<Arc<Replica>>>>,
    /// `--unix-frames`: `unix://` replicas get `Embed` as Tulip frames.
    unix_frames: bool,
    /// Woken when replicas are added, so they are checked at once.
    pub added: Notify,
}

impl ReplicaSet {
    pub fn new(unix_frames: bool) -> Self {
        Self {
            unix_frames,
            ..Self::default()
        }
    }

    pub fn snapshot(&self) -> Arc<Vec<Arc<Replica>>> {
        Arc::clone(&self.list.read().expect("replica set lock poisoned"))
    }

    pub fn routable_count(&self) -> usize {
        self.snapshot().iter().filter(|r| r.is_routable()).count()
    }

    /// Replaces the membership with `urls`, keeping the replicas (and their
    /// connections and load) that stay.
    pub fn set_targets(&self, urls: &[String]) -> Result<(), String> {
        let current = self.snapshot();
        let mut next = Vec::with_capacity(urls.len());
        let mut added = Vec::new();
        for url in urls {
            match current.iter().find(|r| &r.url == url) {
                Some(r) => next.push(Arc::clone(r)),
                None => {
                    next.push(Arc::new(Replica::new(url, self.unix_frames)?));
                    added.push(url.as_str());
                }
            }
        }
        let removed: Vec<&str> = current
            .iter()
            .filter(|r| !urls.contains(&r.url))
            .map(|r| r.url.as_str())
            .collect();
        if added.is_empty() && removed.is_empty() {
            return Ok(());
        }
        tracing::info!(
            ?added,
            ?removed,
            replicas = next.len(),
            "replica set changed"
        );
        *self.list.write().expect("replica set lock poisoned") = Arc::new(next);
        if !added.is_empty() {
            self.added.notify_one();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::replica::Health;

    #[tokio::test]
    async fn membership_changes_keep_existing_replicas() {
        let set = ReplicaSet::default();
        set.set_targets(&["http://10.0.0.1:7070".into(), "http://10.0.0.2:7070".into()])
            .unwrap();
        let first = Arc::clone(&set.snapshot()[0]);
        first.set_health(Health::Serving, "test", false);
        set.set_targets(&["http://10.0.0.1:7070".into(), "http://10.0.0.3:7070".into()])
            .unwrap();
        let now = set.snapshot();
        assert_eq!(
            now.iter().map(|r| r.url.as_str()).collect::<Vec<_>>(),
            ["http://10.0.0.1:7070", "http://10.0.0.3:7070"]
        );
        assert!(Arc::ptr_eq(&first, &now[0]) && now[0].is_routable());
        assert_eq!(now[1].health(), Health::Unknown);
        assert!(set.set_targets(&["not a url".into()]).is_err());
    }
}
