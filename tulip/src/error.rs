//! Tulip's errors and their one mapping to gRPC status codes.

use tonic::{Code, Status};

#[derive(Debug, Clone, thiserror::Error)]
pub enum TulipError {
    /// The request breaks a rule the caller can fix.
    #[error("{0}")]
    InvalidArgument(String),
    /// The server is draining or stopped.
    #[error("{0}")]
    Unavailable(String),
    /// The engine failed on a batch.
    #[error("engine error: {0}")]
    Engine(String),
}

impl From<TulipError> for Status {
    fn from(e: TulipError) -> Self {
        let code = match &e {
            TulipError::InvalidArgument(_) => Code::InvalidArgument,
            TulipError::Unavailable(_) => Code::Unavailable,
            TulipError::Engine(_) => Code::Internal,
        };
        Status::new(code, e.to_string())
    }
}
