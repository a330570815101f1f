//! Tulip's errors and their one mapping to gRPC status codes.

use proto::tulip::v1::DRAINING_METADATA;
use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

#[derive(Debug, Clone, thiserror::Error)]
pub enum TulipError {
    /// The request breaks a rule the caller can fix.
    #[error("{0}")]
    InvalidArgument(String),
    /// The server is draining or stopping: it takes no new work (the
    /// status carries `tulip-draining`, so callers route elsewhere).
    #[error("{0}")]
    Unavailable(String),
    /// The engine failed on a batch.
    #[error("engine error: {0}")]
    Engine(String),
    /// What the request names (a LoRA adapter) is not loaded here.
    #[error("{0}")]
    NotFound(String),
    /// The engine refused what it was given to load (a bad adapter).
    #[error("{0}")]
    Refused(String),
}

impl From<TulipError> for Status {
    fn from(e: TulipError) -> Self {
        let code = match &e {
            TulipError::InvalidArgument(_) => Code::InvalidArgument,
            TulipError::Unavailable(_) => Code::Unavailable,
            TulipError::Engine(_) => Code::Internal,
            TulipError::NotFound(_) => Code::NotFound,
            TulipError::Refused(_) => Code::FailedPrecondition,
        };
        let mut status = Status::new(code, e.to_string());
        if let TulipError::Unavailable(_) = e {
            status
                .metadata_mut()
                .insert(DRAINING_METADATA, MetadataValue::from_static("1"));
        }
        status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unavailable_says_draining_and_other_errors_do_not() {
        let s = Status::from(TulipError::Unavailable("server is draining".into()));
        assert_eq!(s.code(), Code::Unavailable);
        assert!(s.metadata().contains_key(DRAINING_METADATA));
        let s = Status::from(TulipError::Engine("boom".into()));
        assert!(!s.metadata().contains_key(DRAINING_METADATA));
    }
}
