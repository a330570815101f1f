//! The optional API keys, checked in constant time on HTTP and gRPC alike.
//! A key is never logged and never echoed in an error; what it owns (the
//! Batch API's files and batches) is filed under a digest of it, `Owner`.

use subtle::ConstantTimeEq;

use crate::config::Secret;
use crate::error::ApiError;

/// HTTP routes open without a key: probes and scrapes.
pub const PUBLIC_PATHS: [&str; 3] = ["/health", "/ready", "/metrics"];

/// Who a request is, for what it owns: the first 16 bytes of the SHA-256
/// of its key, in hex (stable across replicas and restarts, and useless for
/// recovering the key), or `anonymous` when Ivy runs without keys.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner(pub String);

impl Owner {
    fn of(key: &[u8]) -> Self {
        let digest = ring::digest::digest(&ring::digest::SHA256, key);
        Self(
            digest.as_ref()[..16]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
        )
    }

    pub fn anonymous() -> Self {
        Self("anonymous".into())
    }
}

#[derive(Clone, Debug, Default)]
pub struct ApiKey(Vec<Secret>);

impl ApiKey {
    pub fn new(keys: Vec<Secret>) -> Self {
        Self(keys)
    }

    /// Checks an `Authorization` header value (`Bearer <key>`) against
    /// every key, and says whose it is.
    pub fn check(&self, authorization: Option<&[u8]>) -> Result<Owner, ApiError> {
        if self.0.is_empty() {
            return Ok(Owner::anonymous());
        }
        let Some(value) = authorization else {
            return Err(ApiError::Unauthorized(
                "missing API key: send the header `Authorization: Bearer <key>`".into(),
            ));
        };
        let token = strip_bearer(value).ok_or_else(|| {
            ApiError::Unauthorized("the Authorization header must be `Bearer <key>`".into())
        })?;
        // `ct_eq` compares every byte whatever the first difference, and
        // every key is compared whichever matches; only lengths can differ
        // in time, and they say nothing about a key.
        let mut matched = subtle::Choice::from(0);
        for key in &self.0 {
            matched |= token.ct_eq(key.expose().as_bytes());
        }
        if bool::from(matched) {
            Ok(Owner::of(token))
        } else {
            Err(ApiError::Unauthorized("invalid API key".into()))
        }
    }
}

fn strip_bearer(value: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer ";
    if value.len() < SCHEME.len() || !value[..SCHEME.len()].eq_ignore_ascii_case(SCHEME) {
        return None;
    }
    Some(value[SCHEME.len()..].trim_ascii())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &str) -> ApiKey {
        ApiKey::new(vec![k.parse().unwrap()])
    }

    #[test]
    fn no_key_configured_lets_everything_in() {
        assert!(ApiKey::default().check(None).is_ok());
        assert!(ApiKey::default().check(Some(b"Bearer x")).is_ok());
    }

    #[test]
    fn checks_the_bearer_token() {
        let k = key("s3cret");
        assert!(k.check(Some(b"Bearer s3cret")).is_ok());
        assert!(k.check(Some(b"bearer  s3cret ")).is_ok());
        for bad in [
            &b"Bearer s3cre"[..],
            b"Bearer s3cret2",
            b"s3cret",
            b"Basic s3cret",
            b"Bearer ",
        ] {
            let err = k.check(Some(bad)).unwrap_err();
            assert!(matches!(err, ApiError::Unauthorized(_)));
            assert!(!err.to_string().contains("s3cret"));
        }
        assert!(k.check(None).is_err());
    }

    #[test]
    fn each_key_is_its_own_owner() {
        let k = ApiKey::new(vec!["alpha".parse().unwrap(), "beta".parse().unwrap()]);
        let a = k.check(Some(b"Bearer alpha")).unwrap();
        let b = k.check(Some(b"Bearer beta")).unwrap();
        assert_ne!(a, b);
        assert_eq!(a, k.check(Some(b"Bearer alpha")).unwrap());
        assert_eq!(a.0.len(), 32);
        assert!(k.check(Some(b"Bearer gamma")).is_err());
        assert_eq!(ApiKey::default().check(None).unwrap(), Owner::anonymous());
    }
}
