//! Ivy's configuration: every flag is also an environment variable.

pub mod batch;
pub mod images;
pub mod net;
mod seconds;

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use self::seconds::{parse_seconds, parse_seconds_or_zero};

/// Ivy: the HTTP and gRPC gateway in front of Tulip inference replicas.
#[derive(Debug, Clone, Parser)]
#[command(name = "ivy", version, about)]
pub struct Config {
    /// Tulip replicas, comma-separated gRPC URLs (e.g. http://10.0.0.5:7070).
    /// Exactly one of --tulip and --tulip-dns. Replicas serving different
    /// models form one pool per model.
    /// `host:port` alone means `http://host:port`.
    #[arg(
        long,
        env = "IVY_TULIP",
        value_delimiter = ',',
        required_unless_present = "tulip_dns",
        conflicts_with = "tulip_dns",
        value_parser = parse_tulip_url
    )]
    pub tulip: Vec<String>,

    /// Discover Tulip replicas from DNS: `name:port` of a Kubernetes headless
    /// Service; every address it resolves to is a replica. Comma-separated
    /// for several Services (one per model pool).
    #[arg(long, env = "IVY_TULIP_DNS", value_delimiter = ',')]
    pub tulip_dns: Vec<String>,

    /// The model requests that name none go to (TEI routes, gRPC without
    /// `model`): a model id or its last path part. Default: the first model
    /// to come up (the first --tulip replica's when they start together).
    #[arg(long, env = "IVY_DEFAULT_MODEL")]
    pub default_model: Option<String>,

    /// Seconds between DNS resolutions of --tulip-dns.
    #[arg(long, env = "IVY_DNS_INTERVAL", default_value = "5", value_parser = parse_seconds)]
    pub dns_interval: Duration,

    /// Override: tokenize with this tokenizer.json (or the model directory
    /// holding it). By default Ivy uses the tokenizer the replicas serve
    /// (sent in their Info), so both sides always agree. With several
    /// models, applies to the default model only.
    #[arg(long, env = "IVY_TOKENIZER")]
    pub tokenizer: Option<PathBuf>,

    /// Templates file (TOML: `default_prompt_name`, `[prompts]`). Reloaded on
    /// SIGHUP and when the file changes; a bad file is refused and the
    /// running templates stay.
    #[arg(long, env = "IVY_CONFIG")]
    pub config: Option<PathBuf>,

    /// Require `Authorization: Bearer <key>` on every route except /health,
    /// /ready and /metrics (and on gRPC calls except health checks). Several
    /// keys, comma-separated, are several users: each owns the Batch API
    /// files and batches it creates.
    #[arg(
        long,
        env = "IVY_API_KEY",
        hide_env_values = true,
        value_delimiter = ','
    )]
    pub api_key: Vec<Secret>,

    /// A file of API keys, one per line (blank lines and `#` comments
    /// skipped), accepted beside --api-key.
    #[arg(long, env = "IVY_API_KEY_FILE")]
    pub api_key_file: Option<PathBuf>,

    /// Address to listen on (HTTP and gRPC).
    #[arg(long, env = "IVY_HOST", default_value = "0.0.0.0")]
    pub host: String,

    /// HTTP port.
    #[arg(long, env = "IVY_PORT", default_value_t = 8080)]
    pub port: u16,

    /// gRPC port (ivy.v1 and grpc.health.v1).
    #[arg(long, env = "IVY_GRPC_PORT", default_value_t = 8081)]
    pub grpc_port: u16,

    /// Largest accepted request body, in bytes (413 beyond).
    #[arg(long, env = "IVY_MAX_BODY_BYTES", default_value_t = 8 * 1024 * 1024)]
    pub max_body_bytes: usize,

    /// Most inputs in one request.
    #[arg(long, env = "IVY_MAX_INPUTS", default_value_t = 2048)]
    pub max_inputs: usize,

    /// Default of `truncate` on the text-embeddings-inference routes
    /// (`/embed`, `/embed_sparse`, `/embed_all`, `/rerank`, `/similarity`)
    /// when a request does not say: cut inputs longer than the model's
    /// maximum (true, TEI 1.9's default) or refuse them with 422 (false).
    /// `--auto-truncate` alone means true.
    #[arg(long, env = "IVY_AUTO_TRUNCATE", default_value_t = true, num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set, value_parser = boolish())]
    pub auto_truncate: bool,

    /// Cap on the tokens per input, below the model's own maximum (0 = the
    /// model's maximum as reported by Tulip). [default: the model's maximum]
    #[arg(
        long,
        env = "IVY_MAX_INPUT_LENGTH",
        default_value_t = 0,
        hide_default_value = true
    )]
    pub max_input_length: usize,

    /// Most tokens in one request, all inputs together, after templates and
    /// truncation.
    #[arg(long, env = "IVY_MAX_TOKENS_PER_REQUEST", default_value_t = 1 << 20)]
    pub max_tokens_per_request: usize,

    /// Requests processed at once; more are refused at once with 429.
    #[arg(long, env = "IVY_MAX_CONCURRENT_REQUESTS", default_value_t = 512)]
    pub max_concurrent_requests: usize,

    /// Seconds a request may take, retries included (504 beyond).
    #[arg(long, env = "IVY_REQUEST_TIMEOUT", default_value = "60", value_parser = parse_seconds)]
    pub request_timeout: Duration,

    /// Token budget of one chunk: requests are cut into chunks of at most
    /// this many tokens (a sequence is never split) that run on different
    /// replicas. 0 sends each request whole.
    #[arg(long, env = "IVY_CHUNK_TOKENS", default_value_t = 2048)]
    pub chunk_tokens: usize,

    /// Small chunks bound for the same replica with the same options, read
    /// in the same turn, share one Tulip call (`false`: one call each).
    /// Under load most of a replica's CPU per request is the call itself.
    #[arg(long, env = "IVY_COALESCE", default_value_t = true, num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set, value_parser = boolish())]
    pub coalesce: bool,

    /// `Embed` calls to a `unix://` replica go as Tulip frames, one write
    /// each way instead of HTTP/2's five, when the replica offers them
    /// (`false`: gRPC). Health checks and `Info` stay on gRPC.
    #[arg(long, env = "IVY_UNIX_FRAMES", default_value_t = true, num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set, value_parser = boolish())]
    pub unix_frames: bool,

    /// Most chunks of one request in flight per healthy replica (0 = all at
    /// once). A bound keeps a large request from filling the replicas'
    /// queues, so short requests arriving after it wait behind a few chunks
    /// rather than the whole request; two per replica keep each one busy.
    #[arg(long, env = "IVY_CHUNKS_PER_REPLICA", default_value_t = 2)]
    pub chunks_per_replica: usize,

    /// A request that does not name its priority is interactive when it has
    /// at most this many tokens, else batch. Replicas run interactive work
    /// first; batch work (indexing) is delayed, never starved.
    #[arg(long, env = "IVY_INTERACTIVE_MAX_TOKENS", default_value_t = 512)]
    pub interactive_max_tokens: usize,

    /// Most batch-request work (all of it together) in flight on one
    /// replica, in chunks' worth of tokens (x --chunk-tokens; each chunk
    /// counts its tokens, so many small requests add up to a full chunk);
    /// 0 = no bound. Indexing clients then cannot fill every replica's
    /// queue, and a query is balanced to a replica with room.
    #[arg(long, env = "IVY_BATCH_CHUNKS_PER_REPLICA", default_value_t = 4)]
    pub batch_chunks_per_replica: usize,

    /// Messages of one gRPC `EmbedStream` worked on at once; Ivy reads the
    /// next message only when fewer are in flight (answers still go out in
    /// order), so one stream cannot take every concurrency slot.
    #[arg(long, env = "IVY_STREAM_WINDOW", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub stream_window: u32,

    /// Attempts per chunk: a chunk whose replica fails is retried on another
    /// one, up to this many attempts in all, within the request's timeout.
    #[arg(long, env = "IVY_MAX_ATTEMPTS", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_attempts: u32,

    /// How chunks are spread over replicas.
    #[arg(long, env = "IVY_BALANCE", value_enum, default_value_t = Balance::LeastLoaded)]
    pub balance: Balance,

    /// Seconds a request waits for a replica when none is ready (a pool
    /// scaled to zero starting its first pod) before a 503 with
    /// Retry-After; 0 answers 503 at once. While set, /ready does not
    /// need a replica, so the gateway keeps taking the requests that wake
    /// the pool (`ivy_held_requests` counts them).
    #[arg(long, env = "IVY_COLD_START_HOLD", default_value = "0", value_parser = parse_seconds_or_zero)]
    pub cold_start_hold: Duration,

    /// Seconds to finish in-flight requests after SIGTERM before exiting.
    #[arg(long, env = "IVY_DRAIN_TIMEOUT", default_value = "30", value_parser = parse_seconds)]
    pub drain_timeout: Duration,

    /// Connection timeouts and limits, TLS (see `config/net.rs`).
    #[command(flatten)]
    pub net: crate::config::net::NetConfig,

    /// The Batch API's store and limits (see `config/batch.rs`).
    #[command(flatten)]
    pub batch: crate::config::batch::BatchConfig,

    #[command(flatten)]
    pub images: crate::config::images::ImageConfig,

    /// Seconds between health checks of each replica.
    #[arg(long, env = "IVY_HEALTH_INTERVAL", default_value = "2", value_parser = parse_seconds)]
    pub health_interval: Duration,

    /// Threads serving HTTP and gRPC (0 = half the cores, at least one).
    /// With 1, everything on the request path runs on one thread and no
    /// request wakes another; large tokenization jobs still spread over all
    /// cores. Half: Ivy shares its machine with Tulip or its clients, and on
    /// 2 cores one thread served the same load as two with 15% less CPU and
    /// a lower latency (an idle second worker is woken for every request).
    /// [default: half the cores, at least one]
    #[arg(
        long,
        env = "IVY_IO_THREADS",
        default_value_t = 0,
        hide_default_value = true
    )]
    pub io_threads: usize,

    /// Names the model is served under (comma-separated): `GET /v1/models`
    /// lists them and an OpenAI request naming another model gets 404
    /// `model_not_found`. Default: the model id Tulip reports, and its last
    /// path part (`all-MiniLM-L6-v2` for `sentence-transformers/all-MiniLM-L6-v2`).
    /// With several models, names the default model only.
    #[arg(long, env = "IVY_SERVED_MODEL_NAME", value_delimiter = ',')]
    pub served_model_name: Vec<String>,

    /// Microseconds to busy-poll for a Tulip answer instead of sleeping
    /// (saves a thread wake-up per request; 0 = off). Only while calls are
    /// in flight, and only while they usually answer within this time.
    #[arg(long, env = "IVY_BUSY_POLL_US", default_value_t = 0)]
    pub busy_poll_us: u64,

    /// Logs as one JSON object per line (request id, route, status, timings;
    /// never request bodies or the API key).
    #[arg(long, env = "IVY_JSON_OUTPUT", default_value_t = false, num_args = 0..=1,
          default_missing_value = "true", action = clap::ArgAction::Set, value_parser = boolish())]
    pub json_output: bool,

    /// Origins browsers may call Ivy from (comma-separated; `*` for any).
    /// Off by default: no CORS headers at all.
    #[arg(long, env = "IVY_CORS_ALLOW_ORIGIN", value_delimiter = ',')]
    pub cors_allow_origin: Vec<String>,

    /// Export OpenTelemetry traces to this OTLP/gRPC collector (e.g.
    /// http://otel-collector:4317). A caller's W3C `traceparent` is continued
    /// and passed on to Tulip. Off by default.
    #[arg(long, env = "IVY_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,

    /// `service.name` of the exported spans.
    #[arg(long, env = "IVY_OTLP_SERVICE_NAME", default_value = "ivy")]
    pub otlp_service_name: String,

    /// Log filter (tracing syntax, e.g. "info" or "ivy=debug").
    #[arg(long, env = "IVY_LOG", default_value = "info")]
    pub log: String,

    /// What `POST /` and `POST /invocations` (the Hugging Face client's and
    /// SageMaker's paths) do: `auto` picks by the model's outputs as TEI
    /// does (embed, embed_sparse for a sparse-only model, predict for a
    /// classifier, rerank for a cross-encoder); `sentence-similarity` serves
    /// /similarity there (TEI reads `TASK=sentence-similarity`).
    #[arg(long, env = "IVY_TASK", value_enum, default_value_t = Task::Auto)]
    pub task: Task,

    /// Texts (one per line) the model embeds once, on the first int8/uint8
    /// request, to calibrate the per-dimension ranges of quantized vectors.
    /// Default: the 340 multilingual passages built into Ivy.
    #[arg(long, env = "IVY_CALIBRATION_CORPUS")]
    pub calibration_corpus: Option<PathBuf>,

    /// Quantization ranges to use instead of calibrating (a JSON file as
    /// `GET /quantization/ranges` returns, or a list of them, one per
    /// dimensions/normalize setting): every Ivy of a fleet then quantizes alike.
    #[arg(long, env = "IVY_QUANTIZATION_RANGES")]
    pub quantization_ranges: Option<PathBuf>,

    /// Inputs longer than the model's window, when a request does not say
    /// (`long_inputs`): `truncate` (cut, or refuse if truncation is off, as
    /// TEI does), `pool` (embed overlapping windows and pool them) or `windows`
    /// (one vector per window, on the routes that can return several).
    #[arg(long, env = "IVY_LONG_INPUTS", value_enum, default_value_t = LongInputs::Truncate)]
    pub long_inputs: LongInputs,
}

/// What the paths without a route name serve (`--task`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Task {
    /// By the model's outputs, as text-embeddings-inference does.
    Auto,
    /// `POST /similarity`, for an embedder deployed for the Hub's
    /// sentence-similarity task.
    SentenceSimilarity,
}

/// Inputs longer than the model's window (`--long-inputs`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum LongInputs {
    /// Cut to the window, or refuse without truncation (TEI's semantics).
    #[default]
    Truncate,
    /// Embed overlapping windows and pool them into one vector.
    Pool,
    /// One vector per window.
    Windows,
}

/// Load-balancing policies (see `upstream/balancer.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Balance {
    /// Each chunk goes to the healthy replica with the fewest tokens in flight.
    LeastLoaded,
    /// Chunks go to healthy replicas in turn, ignoring their load (a
    /// baseline for benchmarks).
    RoundRobin,
}

/// A secret flag value: never printed, not even by `Debug`.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl Config {
    /// Every API key: --api-key's and the lines of --api-key-file.
    pub fn api_keys(&self) -> Result<Vec<Secret>, String> {
        let mut keys = self.api_key.clone();
        if let Some(path) = &self.api_key_file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("--api-key-file {}: {e}", path.display()))?;
            for line in text.lines().map(str::trim) {
                if !line.is_empty() && !line.starts_with('#') {
                    keys.push(Secret(line.to_string()));
                }
            }
            if keys.is_empty() {
                return Err(format!("--api-key-file {} holds no key", path.display()));
            }
        }
        Ok(keys)
    }
}

impl FromStr for Secret {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.is_empty() {
            return Err("the API key must not be empty".into());
        }
        Ok(Self(s.to_string()))
    }
}

/// Every boolean flag reads the same way, as Tulip's do: `--flag` alone is
/// true; `--flag VALUE` and the variable take true/false, yes/no, on/off,
/// 1/0 (also y/n, t/f; any case).
fn boolish() -> clap::builder::BoolishValueParser {
    clap::builder::BoolishValueParser::new()
}

/// A `--tulip` entry: `http://`, `https://` or `unix://` URLs as given, and
/// `host:port` as `http://host:port` (what a newcomer types first); any
/// other form is refused at start rather than failing every health check.
fn parse_tulip_url(s: &str) -> Result<String, String> {
    let s = s.trim();
    let url = match s.split_once("://") {
        Some(("http" | "https" | "unix", rest)) if !rest.is_empty() => s.to_string(),
        Some((scheme, _)) => {
            return Err(format!(
                "`{s}`: Tulip URLs are http://HOST:PORT, https://HOST:PORT or unix:///PATH, not {scheme}://"
            ))
        }
        None => format!("http://{s}"),
    };
    let authority = url.split_once("://").map_or("", |(_, rest)| rest);
    if !url.starts_with("unix://") && !authority.contains(':') {
        return Err(format!(
            "`{s}`: a Tulip URL needs its port, e.g. http://{authority}:7070"
        ));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tulip_urls_without_a_scheme_are_http() {
        let c = parse(&["--tulip", "127.0.0.1:7070,http://b:2,unix:///tmp/t.sock"]).unwrap();
        assert_eq!(
            c.tulip,
            ["http://127.0.0.1:7070", "http://b:2", "unix:///tmp/t.sock"]
        );
        let e = parse(&["--tulip", "grpc://a:1"]).unwrap_err().to_string();
        assert!(e.contains("http://HOST:PORT"), "{e}");
        assert!(parse(&["--tulip", "tulip-host"]).is_err());
    }

    #[test]
    fn booleans_read_like_tulips() {
        let base = ["--tulip", "http://a:1"];
        let c = parse(
            &[
                &base[..],
                &["--json-output", "--coalesce", "no", "--unix-frames", "OFF"],
            ]
            .concat(),
        )
        .unwrap();
        assert!(c.json_output && !c.coalesce && !c.unix_frames);
        let c = parse(&[&base[..], &["--json-output", "yes", "--auto-truncate", "0"]].concat())
            .unwrap();
        assert!(c.json_output && !c.auto_truncate);
        assert!(!parse(&base).unwrap().json_output);
        assert!(parse(&[&base[..], &["--coalesce", "maybe"]].concat()).is_err());
    }

    fn parse(args: &[&str]) -> Result<Config, clap::Error> {
        Config::try_parse_from([&["ivy", "--tokenizer", "t"], args].concat())
    }

    #[test]
    fn exactly_one_replica_source() {
        assert!(parse(&[]).is_err());
        assert!(parse(&["--tulip", "http://a:1", "--tulip-dns", "tulip:7070"]).is_err());
        assert_eq!(
            parse(&["--tulip", "http://a:1,http://b:2"])
                .unwrap()
                .tulip
                .len(),
            2
        );
        assert!(parse(&["--tulip-dns", "tulip:7070"])
            .unwrap()
            .tulip
            .is_empty());
    }

    #[test]
    fn secret_is_redacted() {
        let c = parse(&["--tulip", "http://a:1", "--api-key", "hunter2"]).unwrap();
        assert!(!format!("{c:?}").contains("hunter2"));
        assert_eq!(c.api_key[0].expose(), "hunter2");
        let c = parse(&["--tulip", "http://a:1", "--api-key", "a,b"]).unwrap();
        assert_eq!(c.api_key.len(), 2);
    }

    #[test]
    fn seconds_must_be_positive() {
        assert!(parse(&["--tulip", "http://a:1", "--request-timeout", "0"]).is_err());
        assert!(parse(&["--tulip", "http://a:1", "--request-timeout", "x"]).is_err());
        let c = parse(&["--tulip", "http://a:1", "--drain-timeout", "1.5"]).unwrap();
        assert_eq!(c.drain_timeout, Duration::from_millis(1500));
    }
}
