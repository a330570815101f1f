//! Where the replicas are: a static list (`--tulip`), or the addresses DNS
//! names resolve to (`--tulip-dns`, Kubernetes headless Services: one A/AAAA
//! record per ready pod; several names for several model pools, whose
//! replicas then group by the model they report), re-resolved every
//! `--dns-interval`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::upstream::set::ReplicaSet;

pub enum Source {
    Static(Vec<String>),
    Dns {
        targets: Vec<String>,
        interval: Duration,
    },
}

/// Fills the set now and, for DNS, keeps it current.
pub async fn start(source: Source, set: Arc<ReplicaSet>) -> Result<(), String> {
    match source {
        Source::Static(urls) => {
            let mut unique: Vec<String> = Vec::with_capacity(urls.len());
            for url in urls.iter().map(|u| u.trim()).filter(|u| !u.is_empty()) {
                if !unique.iter().any(|u| u == url) {
                    unique.push(url.to_string());
                }
            }
            let urls = unique;
            if urls.is_empty() {
                return Err("no Tulip replica given (--tulip)".into());
            }
            set.set_targets(&urls)
        }
        Source::Dns { targets, interval } => {
            let targets: Vec<(String, u16)> = targets
                .iter()
                .map(|t| dns_port(t).map(|port| (t.clone(), port)))
                .collect::<Result<_, _>>()?;
            if targets.is_empty() {
                return Err("no DNS name given (--tulip-dns)".into());
            }
            // A Service with no ready pod does not resolve: start empty and
            // keep trying rather than refusing to start.
            let mut known = vec![Vec::new(); targets.len()];
            resolve_into(&targets, &mut known, &set).await;
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(interval).await;
                    resolve_into(&targets, &mut known, &set).await;
                }
            });
            Ok(())
        }
    }
}

fn dns_port(target: &str) -> Result<u16, String> {
    let (host, port) = target
        .rsplit_once(':')
        .ok_or_else(|| format!("--tulip-dns `{target}` must be `name:port`"))?;
    if host.is_empty() {
        return Err(format!("--tulip-dns `{target}` has no host name"));
    }
    port.parse()
        .map_err(|_| format!("--tulip-dns `{target}`: `{port}` is not a port"))
}

/// Resolves every name; a name that fails (or resolves to nothing) keeps
/// its last addresses, so one Service's hiccup does not drop its replicas.
async fn resolve_into(targets: &[(String, u16)], known: &mut [Vec<String>], set: &ReplicaSet) {
    for ((target, port), last) in targets.iter().zip(known.iter_mut()) {
        match tokio::net::lookup_host(target.as_str()).await {
            Ok(addrs) => {
                let urls = urls_for(addrs, *port);
                if urls.is_empty() {
                    tracing::warn!(
                        target,
                        "DNS name resolved to no address; keeping the current replicas"
                    );
                } else {
                    *last = urls;
                }
            }
            // Keep routing to the replicas known so far; their health checks
            // take out the ones that are really gone.
            Err(e) => {
                tracing::warn!(target, error = %e, "DNS resolution failed; keeping the current replicas")
            }
        }
    }
    let mut urls: Vec<String> = Vec::new();
    for url in known.iter().flatten() {
        if !urls.contains(url) {
            urls.push(url.clone());
        }
    }
    if urls.is_empty() {
        return;
    }
    if let Err(e) = set.set_targets(&urls) {
        tracing::error!(error = %e, "cannot use the resolved replicas");
    }
}

/// Sorted, de-duplicated `http://addr:port` URLs.
fn urls_for(addrs: impl IntoIterator<Item = SocketAddr>, port: u16) -> Vec<String> {
    let mut urls: Vec<String> = addrs
        .into_iter()
        .map(|a| format!("http://{}", SocketAddr::new(a.ip(), port)))
        .collect();
    urls.sort();
    urls.dedup();
    urls
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_sorted_unique_and_bracket_ipv6() {
        let addrs: Vec<SocketAddr> = [
            "10.0.0.2:7070",
            "10.0.0.1:7070",
            "10.0.0.2:7070",
            "[fd00::1]:7070",
        ]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
        assert_eq!(
            urls_for(addrs, 7070),
            [
                "http://10.0.0.1:7070",
                "http://10.0.0.2:7070",
                "http://[fd00::1]:7070"
            ]
        );
    }

    #[test]
    fn dns_target_needs_a_port() {
        assert_eq!(dns_port("tulip.ns.svc.cluster.local:7070").unwrap(), 7070);
        assert!(dns_port("tulip").is_err());
        assert!(dns_port(":7070").is_err());
        assert!(dns_port("tulip:http").is_err());
    }

    #[tokio::test]
    async fn dns_fills_the_set_and_static_needs_urls() {
        let set = Arc::new(ReplicaSet::default());
        let source = Source::Dns {
            targets: vec!["localhost:7070".into(), "localhost:7071".into()],
            interval: Duration::from_secs(60),
        };
        start(source, Arc::clone(&set)).await.unwrap();
        let urls: Vec<String> = set.snapshot().iter().map(|r| r.url.clone()).collect();
        assert!(
            urls.contains(&"http://127.0.0.1:7070".to_string())
                && urls.contains(&"http://127.0.0.1:7071".to_string()),
            "{urls:?}"
        );
        assert!(start(Source::Static(vec![" ".into()]), Arc::clone(&set))
            .await
            .is_err());
        let urls = vec![
            "http://10.0.0.9:7070".to_string(),
            " http://10.0.0.9:7070".into(),
        ];
        start(Source::Static(urls), Arc::clone(&set)).await.unwrap();
        assert_eq!(set.snapshot().len(), 1);
    }
}
