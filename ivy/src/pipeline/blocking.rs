//! Work over many inputs (tokenizing, decoding) runs on a blocking thread,
//! off the reactor, so a large request cannot stall other connections; a
//! small one stays on the calling task, where it costs less than the hop.

use crate::error::ApiError;

/// Inputs beyond this many are worked on a blocking thread.
pub const INLINE_INPUTS: usize = 8;

/// Runs `work` on a blocking thread; `what` names it if the thread fails.
pub async fn off_reactor<T: Send + 'static>(
    what: &str,
    work: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::Internal(format!("{what} task failed: {e}")))?
}
