//! Ivy's configuration: every flag is also an environment variable.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

/// Ivy: the HTTP gateway in front of Tulip inference replicas.
#[derive(Debug, Clone, Parser)]
#[command(name = "ivy", version, about)]
pub struct Config {
    /// Tulip replicas, comma-separated gRPC URLs (e.g. http://127.0.0.1:7070).
    #[arg(long, env = "IVY_TULIP", value_delimiter = ',', required = true)]
    pub tulip: Vec<String>,

    /// The model's tokenizer: a tokenizer.json file or a model directory.
    #[arg(long, env = "IVY_TOKENIZER")]
    pub tokenizer: PathBuf,

    /// Address to listen on.
    #[arg(long, env = "IVY_HOST", default_value = "0.0.0.0")]
    pub host: String,

    /// HTTP port.
    #[arg(long, env = "IVY_PORT", default_value_t = 8080)]
    pub port: u16,

    /// Largest accepted request body, in bytes (413 beyond).
    #[arg(long, env = "IVY_MAX_BODY_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Most inputs in one request (422 beyond).
    #[arg(long, env = "IVY_MAX_INPUTS", default_value_t = 2048)]
    pub max_inputs: usize,

    /// Cap on the tokens per input, below the model's own maximum (0 = the
    /// model's maximum as reported by Tulip).
    #[arg(long, env = "IVY_MAX_INPUT_LENGTH", default_value_t = 0)]
    pub max_input_length: usize,

    /// Seconds between health checks of each replica.
    #[arg(long, env = "IVY_HEALTH_INTERVAL", default_value = "2", value_parser = parse_seconds)]
    pub health_interval: Duration,

    /// Log filter (tracing syntax, e.g. "info" or "ivy=debug").
    #[arg(long, env = "IVY_LOG", default_value = "info")]
    pub log: String,
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .parse()
        .map_err(|_| format!("`{s}` is not a number of seconds"))?;
    if !(secs.is_finite() && secs > 0.0) {
        return Err(format!("`{s}` must be a positive number of seconds"));
    }
    Ok(Duration::from_secs_f64(secs))
}
