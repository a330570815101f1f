//! One level = N clients started together, each with its own connection,
//! sending its share of the requests back to back; latencies are taken
//! around each call, after per-client warm-up.

use std::sync::Arc;
use std::time::{Duration, Instant};

use proto::tulip::v1::tulip_client::TulipClient;
use serde_json::{json, Value};
use tokio::sync::Barrier;
use tonic::transport::Channel;

use crate::http;
use crate::input::Requests;
use crate::{Args, Mode};

/// The whole report: one entry per level, plus the floor when asked for.
pub async fn main(args: Args) -> Result<Value, String> {
    let requests = Arc::new(Requests::read(&args.input, args.mode)?);
    let timeout = Duration::from_secs_f64(args.timeout_s);
    if let Some(rate) = args.rate {
        let target = args.target.as_deref().ok_or("--rate needs --target")?;
        let schedule = crate::rate::Schedule {
            rate,
            duration: Duration::from_secs_f64(args.duration_s),
            connections: args.connections,
            go_stdin: args.go_stdin,
        };
        let prepared = Arc::new(prepare(&requests));
        let level = crate::rate::run(target, &requests, &prepared, &schedule, timeout).await?;
        return Ok(json!({"mode": format!("{:?}", args.mode).to_lowercase(), "rate": level}));
    }
    let mut report = json!({"mode": format!("{:?}", args.mode).to_lowercase(), "levels": {}});
    if let Some(target) = &args.target {
        for &c in &args.concurrency {
            let level = run_level(
                target,
                &requests,
                c.max(1),
                args.requests,
                args.warmup,
                timeout,
            )
            .await?;
            report["levels"][c.to_string()] = level;
        }
    } else if !args.floor {
        return Err("--target is required (or --floor alone)".into());
    }
    if args.floor {
        let target = match args.mode {
            Mode::Grpc => crate::null::grpc()?.to_string(),
            Mode::Http => crate::null::http().await?.to_string(),
        };
        report["floor"] =
            run_level(&target, &requests, 1, args.requests, args.warmup, timeout).await?;
    }
    Ok(report)
}

pub(crate) enum Conn {
    Grpc(TulipClient<Channel>),
    Http(http::Client),
}

impl Conn {
    pub(crate) async fn open(target: &str, requests: &Requests) -> Result<Self, String> {
        Ok(match requests {
            Requests::Grpc(_) => {
                let channel = Channel::from_shared(format!("http://{target}"))
                    .map_err(|e| e.to_string())?
                    .tcp_nodelay(true)
                    .connect()
                    .await
                    .map_err(|e| format!("connect {target}: {e}"))?;
                Conn::Grpc(TulipClient::new(channel).max_decoding_message_size(256 << 20))
            }
            Requests::Http(..) => Conn::Http(http::Client::connect(target).await?),
        })
    }

    /// One request (the `i`-th, round-robin) and the server's timing; Err
    /// on failure or timeout.
    pub(crate) async fn call(
        &mut self,
        requests: &Requests,
        prepared: &[Vec<u8>],
        i: usize,
        timeout: Duration,
    ) -> Result<http::Timing, String> {
        let fut = async {
            match (self, requests) {
                (Conn::Grpc(c), Requests::Grpc(r)) => c
                    .embed(r[i % r.len()].clone())
                    .await
                    .map(|resp| {
                        let t = resp.into_inner().timing.unwrap_or_default();
                        http::Timing {
                            queue_ms: Some(t.queue_us as f64 / 1e3),
                            inference_ms: Some(t.inference_us as f64 / 1e3),
                        }
                    })
                    .map_err(|s| format!("{:?}: {}", s.code(), s.message())),
                (Conn::Http(c), Requests::Http(..)) => {
                    match c.send_timed(&prepared[i % prepared.len()]).await? {
                        (200, timing) => Ok(timing),
                        (s, _) => Err(format!("HTTP {s}")),
                    }
                }
                _ => unreachable!("connection and requests of the same mode"),
            }
        };
        tokio::time::timeout(timeout, fut)
            .await
            .map_err(|_| format!("no answer within {timeout:?}"))?
    }
}

async fn run_level(
    target: &str,
    requests: &Arc<Requests>,
    clients: usize,
    total: usize,
    warmup: usize,
    timeout: Duration,
) -> Result<Value, String> {
    let prepared: Arc<Vec<Vec<u8>>> = Arc::new(prepare(requests));
    let per_client = total.div_ceil(clients).max(1);
    let barrier = Arc::new(Barrier::new(clients));
    let mut tasks = Vec::with_capacity(clients);
    for k in 0..clients {
        let (target, requests, prepared, barrier) = (
            target.to_owned(),
            Arc::clone(requests),
            Arc::clone(&prepared),
            Arc::clone(&barrier),
        );
        tasks.push(tokio::spawn(async move {
            let mut conn = Conn::open(&target, &requests).await?;
            for j in 0..warmup {
                conn.call(&requests, &prepared, k + j, timeout).await?;
            }
            barrier.wait().await; // every client starts its timed requests together
            let started = Instant::now();
            let mut lat = Vec::with_capacity(per_client);
            let mut errors = Vec::new();
            for j in 0..per_client {
                let t = Instant::now();
                match conn
                    .call(&requests, &prepared, k + warmup + j, timeout)
                    .await
                {
                    Ok(_) => lat.push(t.elapsed().as_secs_f64()),
                    Err(e) => errors.push(e),
                }
            }
            Ok::<_, String>((lat, errors, started, Instant::now()))
        }));
    }
    let mut latencies = Vec::new();
    let mut errors = Vec::new();
    let (mut first, mut last) = (None::<Instant>, None::<Instant>);
    for t in tasks {
        let (lat, errs, start, end) = t.await.map_err(|e| e.to_string())??;
        latencies.extend(lat);
        errors.extend(errs);
        first = Some(first.map_or(start, |f| f.min(start)));
        last = Some(last.map_or(end, |l| l.max(end)));
    }
    let wall = match (first, last) {
        (Some(f), Some(l)) => l.duration_since(f).as_secs_f64(),
        _ => 0.0,
    };
    Ok(summary(clients, latencies, errors, wall))
}

/// HTTP requests as bytes on the wire (gRPC requests are sent as messages).
fn prepare(requests: &Requests) -> Vec<Vec<u8>> {
    match requests {
        Requests::Http(path, bodies) => bodies
            .iter()
            .map(|b| http::Client::prepare(path, b))
            .collect(),
        Requests::Grpc(_) => Vec::new(),
    }
}

/// Percentiles (ms, nearest rank), throughput and the raw latencies (µs).
fn summary(clients: usize, mut lat: Vec<f64>, errors: Vec<String>, wall: f64) -> Value {
    lat.sort_by(f64::total_cmp);
    let pct = |p: f64| -> Option<f64> {
        if lat.is_empty() {
            return None;
        }
        let i = ((p / 100.0) * lat.len() as f64).ceil() as usize;
        Some((lat[i.clamp(1, lat.len()) - 1] * 1e6).round() / 1e3)
    };
    json!({
        "clients": clients,
        "count": lat.len(),
        "errors": errors.len(),
        "first_error": errors.first(),
        "p50": pct(50.0), "p90": pct(90.0), "p99": pct(99.0),
        "mean": if lat.is_empty() { None } else { Some((lat.iter().sum::<f64>() / lat.len() as f64 * 1e6).round() / 1e3) },
        "wall_s": wall,
        "requests_per_s": if wall > 0.0 { lat.len() as f64 / wall } else { 0.0 },
        "latencies_us": lat.iter().map(|s| (s * 1e6).round() as u64).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let lat: Vec<f64> = (1..=100).map(|i| i as f64 * 1e-3).collect();
        let s = summary(2, lat, vec!["x".into()], 0.5);
        assert_eq!(s["p50"], 50.0);
        assert_eq!(s["p99"], 99.0);
        assert_eq!(s["count"], 100);
        assert_eq!(s["errors"], 1);
        assert_eq!(s["requests_per_s"], 200.0);
    }

    #[tokio::test]
    async fn the_floor_runs_against_null_servers() {
        let dir = std::env::temp_dir().join(format!("loadgen-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let grpc = dir.join("grpc.json");
        std::fs::write(
            &grpc,
            r#"{"requests": [{"token_ids": [101, 7, 102], "lengths": [3]}]}"#,
        )
        .unwrap();
        let http = dir.join("http.json");
        std::fs::write(
            &http,
            r#"{"path": "/v1/embeddings", "bodies": [{"input": "hello"}]}"#,
        )
        .unwrap();
        for (mode, input) in [(Mode::Grpc, grpc), (Mode::Http, http)] {
            let args = Args {
                mode,
                target: None,
                input,
                concurrency: vec![1],
                requests: 20,
                warmup: 2,
                timeout_s: 10.0,
                floor: true,
                rate: None,
                duration_s: 10.0,
                connections: 64,
                go_stdin: false,
            };
            let report = main(args).await.unwrap();
            assert_eq!(report["floor"]["count"], 20, "{mode:?}: {report}");
            assert_eq!(report["floor"]["errors"], 0, "{mode:?}: {report}");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}
