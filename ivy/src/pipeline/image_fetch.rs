//! Images given by URL, fetched only from the hosts an operator listed
//! (`--image-url-hosts`; none by default, and then every URL is refused).
//! A fetch is bounded in bytes (`--max-image-bytes`) and time
//! (`--image-url-timeout`), follows no redirect, and never reaches a
//! private, loopback or link-local address unless the operator listed that
//! address itself: the name is resolved here, every address checked, and
//! the connection pinned to a checked one, so a name cannot be re-resolved
//! elsewhere between the check and the connection.

use std::net::{IpAddr, SocketAddr};

use bytes::{Bytes, BytesMut};
use reqwest::redirect::Policy;
use reqwest::Url;

use crate::config::images::ImageConfig;
use crate::error::ApiError;

/// Fetches `url` for the input named `at` (`input[2].image`).
pub async fn fetch(
    config: &ImageConfig,
    url: &str,
    field: &'static str,
    at: &str,
) -> Result<Bytes, ApiError> {
    let refuse = |why: String| ApiError::validation(field, format!("{at}: {why}"));
    let hosts = parse_hosts(&config.image_url_hosts.join(","));
    if hosts.is_empty() {
        return Err(refuse(
            "is a URL, and this Ivy fetches no images (--image-url-hosts is empty): send the image's bytes \
             as a data URI or base64"
                .into(),
        ));
    }
    let parsed = Url::parse(url).map_err(|e| refuse(format!("is not a URL ({e})")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(refuse(format!(
            "scheme {:?} is not fetched (http, https)",
            parsed.scheme()
        )));
    }
    let host = parsed
        .host_str()
        .map(|h| {
            h.trim_start_matches('[')
                .trim_end_matches(']')
                .to_ascii_lowercase()
        })
        .ok_or_else(|| refuse("has no host".into()))?;
    let Some(entry) = hosts.iter().find(|e| listed(e, &host)) else {
        return Err(refuse(format!("host {host} is not in --image-url-hosts")));
    };
    let port = parsed.port_or_known_default().unwrap_or(443);
    let addr = resolve(&host, port, entry.parse::<IpAddr>().is_ok())
        .await
        .map_err(refuse)?;
    let client = reqwest::Client::builder()
        .redirect(Policy::none())
        .timeout(config.image_url_timeout)
        .connect_timeout(config.image_url_timeout)
        .resolve(&host, addr)
        .build()
        .map_err(|e| ApiError::Internal(format!("the image fetch client: {e}")))?;
    let deadline = tokio::time::Instant::now() + config.image_url_timeout;
    let fetched =
        tokio::time::timeout_at(deadline, read(client, parsed, config.max_image_bytes)).await;
    match fetched {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(Fetch::TooLarge)) => Err(ApiError::ImageTooLarge(format!(
            "{at}: the image at {url} is over {} bytes (--max-image-bytes)",
            config.max_image_bytes
        ))),
        Ok(Err(Fetch::Failed(why))) => Err(refuse(format!("fetching {url}: {why}"))),
        Err(_) => Err(refuse(format!(
            "fetching {url} took over {:.1}s (--image-url-timeout)",
            config.image_url_timeout.as_secs_f64()
        ))),
    }
}

enum Fetch {
    TooLarge,
    Failed(String),
}

async fn read(client: reqwest::Client, url: Url, limit: usize) -> Result<Bytes, Fetch> {
    let mut response = client
        .get(url)
        .send()
        .await
        .map_err(|e| Fetch::Failed(e.to_string()))?;
    let status = response.status();
    if status.is_redirection() {
        return Err(Fetch::Failed(format!(
            "answered {status}; redirects are not followed"
        )));
    }
    if !status.is_success() {
        return Err(Fetch::Failed(format!("answered {status}")));
    }
    if response.content_length().is_some_and(|n| n > limit as u64) {
        return Err(Fetch::TooLarge);
    }
    let mut body = BytesMut::new();
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| Fetch::Failed(e.to_string()))?
    {
        if body.len() + chunk.len() > limit {
            return Err(Fetch::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body.freeze())
}

/// An allow-list entry matches its host exactly, or (`.example.com`) any
/// name under it.
fn listed(entry: &str, host: &str) -> bool {
    match entry.strip_prefix('.') {
        Some(domain) => host.ends_with(&format!(".{domain}")),
        None => entry == host,
    }
}

/// The address to connect to: every address the name resolves to must be
/// public, unless the operator listed the address itself.
async fn resolve(host: &str, port: u16, listed_address: bool) -> Result<SocketAddr, String> {
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| format!("host {host} does not resolve ({e})"))?
        .collect();
    if !listed_address {
        if let Some(private) = addrs.iter().find(|a| !public(a.ip())) {
            return Err(format!(
                "host {host} resolves to {}, a private address; only an address listed itself in \
                 --image-url-hosts is fetched from",
                private.ip()
            ));
        }
    }
    addrs
        .first()
        .copied()
        .ok_or_else(|| format!("host {host} resolves to no address"))
}

fn public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            !(v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || v4.is_documentation()
                || (a == 100 && (64..128).contains(&b)) // shared address space (CGNAT)
                || a == 0)
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return public(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00 // unique local
                || (first & 0xffc0) == 0xfe80) // link local
        }
    }
}

/// The flag's value: hosts (names or addresses), comma-separated.
pub fn parse_hosts(s: &str) -> Vec<String> {
    s.split(',')
        .map(|h| {
            h.trim()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_ascii_lowercase()
        })
        .filter(|h| !h.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_addresses_are_not_public() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "192.168.0.1",
            "172.16.5.5",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:10.0.0.1",
        ] {
            assert!(!public(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["93.184.216.34", "8.8.8.8", "2606:4700::1111"] {
            assert!(public(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn hosts_match_exactly_or_under_a_listed_domain() {
        let hosts = parse_hosts(" images.example.com, .cdn.example.org ,[::1]");
        assert_eq!(hosts, ["images.example.com", ".cdn.example.org", "::1"]);
        assert!(listed(&hosts[0], "images.example.com"));
        assert!(!listed(&hosts[0], "evil-images.example.com"));
        assert!(listed(&hosts[1], "a.cdn.example.org"));
        assert!(!listed(&hosts[1], "cdn.example.org.evil.com"));
    }
}
