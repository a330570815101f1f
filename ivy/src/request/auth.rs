//! The optional API key, checked in constant time on HTTP and gRPC alike.
//! The key is never logged and never echoed in an error.

use subtle::ConstantTimeEq;

use crate::config::Secret;
use crate::error::ApiError;

/// HTTP routes open without a key: probes and scrapes.
pub const PUBLIC_PATHS: [&str; 3] = ["/health", "/ready", "/metrics"];

#[derive(Clone, Debug, Default)]
pub struct ApiKey(Option<Secret>);

impl ApiKey {
    pub fn new(key: Option<Secret>) -> Self {
        Self(key)
    }

    /// Checks an `Authorization` header value (`Bearer <key>`).
    pub fn check(&self, authorization: Option<&[u8]>) -> Result<(), ApiError> {
        let Some(key) = &self.0 else {
            return Ok(());
        };
        let Some(value) = authorization else {
            return Err(ApiError::Unauthorized(
                "missing API key: send the header `Authorization: Bearer <key>`".into(),
            ));
        };
        let token = strip_bearer(value).ok_or_else(|| {
            ApiError::Unauthorized("the Authorization header must be `Bearer <key>`".into())
        })?;
        // `ct_eq` compares every byte whatever the first difference; only
        // the length can differ in time, and it says nothing about the key.
        if bool::from(token.ct_eq(key.expose().as_bytes())) {
            Ok(())
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
        ApiKey::new(Some(k.parse().unwrap()))
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
}
