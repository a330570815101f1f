//! Ivy's flags for its public listeners: connection timeouts and limits,
//! and TLS. Part of `Config` (flattened), kept apart so the listener code
//! has one small struct to read.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::seconds::parse_seconds;
use crate::net::conn_io::Timeouts;

#[derive(Debug, Clone, Args)]
pub struct NetConfig {
    /// Seconds a client has to send a request's headers: from the moment it
    /// connects, or from the first byte of a later request on a keep-alive
    /// connection (the connection is closed beyond). On TLS listeners, also
    /// the limit for the TLS handshake and, on gRPC, for the HTTP/2 preface.
    #[arg(long, env = "IVY_HEADER_TIMEOUT", default_value = "10", value_parser = parse_seconds)]
    pub header_timeout: Duration,

    /// Seconds a client has to send a whole request body once its headers
    /// have arrived (408 beyond).
    #[arg(long, env = "IVY_BODY_TIMEOUT", default_value = "30", value_parser = parse_seconds)]
    pub body_timeout: Duration,

    /// Seconds an HTTP keep-alive connection may sit idle between requests
    /// before it is closed. On gRPC, a connection quiet this long is pinged
    /// (HTTP/2 keepalive) and closed unless the ping is answered within
    /// --write-timeout.
    #[arg(long, env = "IVY_IDLE_TIMEOUT", default_value = "60", value_parser = parse_seconds)]
    pub idle_timeout: Duration,

    /// Seconds a response may wait on a client that does not read it (no
    /// write progress) before the connection is closed.
    #[arg(long, env = "IVY_WRITE_TIMEOUT", default_value = "30", value_parser = parse_seconds)]
    pub write_timeout: Duration,

    /// Most open client connections on each listener (HTTP and gRPC); beyond,
    /// new connections wait in the kernel's accept queue until one closes.
    #[arg(long, env = "IVY_MAX_CONNECTIONS", default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,

    /// Seconds after which a gRPC connection is asked to reconnect (GOAWAY,
    /// then --drain-timeout to finish its calls). Default: no limit.
    #[arg(long, env = "IVY_GRPC_MAX_CONNECTION_AGE", value_parser = parse_seconds)]
    pub grpc_max_connection_age: Option<Duration>,

    /// PEM certificate chain: serve HTTPS and gRPC over TLS on the same
    /// ports (with --tls-key). Default: plain text.
    #[arg(long, env = "IVY_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// PEM private key of --tls-cert.
    #[arg(long, env = "IVY_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl NetConfig {
    pub fn timeouts(&self) -> Timeouts {
        Timeouts {
            header: self.header_timeout,
            idle: self.idle_timeout,
            write: self.write_timeout,
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<Config, clap::Error> {
        Config::try_parse_from([&["ivy", "--tulip", "http://a:1"], args].concat())
    }

    #[test]
    fn defaults_bound_every_wait() {
        let c = parse(&[]).unwrap().net;
        assert!(c.header_timeout.as_secs() > 0 && c.body_timeout.as_secs() > 0);
        assert!(c.idle_timeout.as_secs() > 0 && c.write_timeout.as_secs() > 0);
        assert!(c.max_connections > 0);
        assert!(c.tls_cert.is_none() && c.grpc_max_connection_age.is_none());
    }

    #[test]
    fn tls_needs_both_files_and_limits_are_positive() {
        assert!(parse(&["--tls-cert", "c.pem"]).is_err());
        assert!(parse(&["--tls-key", "k.pem"]).is_err());
        assert!(parse(&["--tls-cert", "c.pem", "--tls-key", "k.pem"]).is_ok());
        assert!(parse(&["--max-connections", "0"]).is_err());
        assert!(parse(&["--header-timeout", "0"]).is_err());
        let c = parse(&["--idle-timeout", "1.5"]).unwrap().net;
        assert_eq!(c.idle_timeout.as_millis(), 1500);
    }
}
