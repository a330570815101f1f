//! Server settings, filled by the Python launcher from flags and env vars.

use std::time::Duration;

use crate::priority;

#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub host: String,
    pub port: u16,
    /// Most tokens in one engine step.
    pub max_batch_tokens: usize,
    /// Most sequences in one engine step.
    pub max_batch_sequences: usize,
    /// Most sequences in one request (INVALID_ARGUMENT beyond).
    pub max_request_sequences: usize,
    /// Steps launched but not yet completed (overlap depth).
    pub max_inflight: usize,
    /// On SIGTERM/Ctrl-C: how long to let in-flight requests finish.
    pub drain_timeout: Duration,
    /// Largest accepted request message.
    pub max_message_bytes: usize,
    /// HTTP port for /metrics and /health; 0 disables it.
    pub metrics_port: u16,
    /// A request that finds the engine idle runs its step on its own thread.
    pub inline_steps: bool,
    /// Also listen on this Unix socket (for a co-located Ivy).
    pub unix_socket: Option<String>,
    /// Threads of the gRPC runtime (0 = one per core).
    pub io_threads: usize,
    pub priority: priority::Settings,
}

impl ServeConfig {
    pub fn check(&self) -> Result<(), String> {
        if self.max_batch_tokens == 0 || self.max_batch_sequences == 0 {
            return Err("max_batch_tokens and max_batch_sequences must be positive".into());
        }
        if self.max_request_sequences == 0 {
            return Err("max_request_sequences must be positive".into());
        }
        if self.max_inflight == 0 {
            return Err("max_inflight must be at least 1".into());
        }
        Ok(())
    }
}
