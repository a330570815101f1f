//! Open loop: requests on a fixed schedule (`--rate` per second for
//! `--duration` seconds) from `--connections` keep-alive connections, as a
//! search box's users send them: a slow answer does not hold the next
//! query back while a connection is free. Latency is taken from the actual
//! send; a slot sent more than `LATE` after its time (every connection was
//! busy) is counted as late. With `--go-stdin` the connections are opened
//! and warmed first, "ready" goes to stderr, and the schedule starts when a
//! line arrives on stdin (so several load sources start together).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::input::Requests;
use crate::run::Conn;

const LATE: Duration = Duration::from_millis(10);

pub struct Schedule {
    pub rate: f64,
    pub duration: Duration,
    pub connections: usize,
    pub go_stdin: bool,
}

#[derive(Default)]
struct Record {
    /// (slot, send offset from the start in µs, latency in µs, the
    /// server's queue and inference ms)
    done: Vec<(usize, u64, u64, f64, f64)>,
    errors: Vec<String>,
    late: usize,
}

pub async fn run(
    target: &str,
    requests: &Arc<Requests>,
    prepared: &Arc<Vec<Vec<u8>>>,
    s: &Schedule,
    timeout: Duration,
) -> Result<Value, String> {
    if !(s.rate > 0.0 && s.rate.is_finite()) {
        return Err(format!("--rate must be a positive number, got {}", s.rate));
    }
    let mut conns = Vec::with_capacity(s.connections);
    for k in 0..s.connections.max(1) {
        let mut c = Conn::open(target, requests).await?;
        c.call(requests, prepared, k, timeout).await?; // warm: connection and server path
        conns.push(c);
    }
    if s.go_stdin {
        eprintln!("ready");
        tokio::task::spawn_blocking(|| std::io::stdin().read_line(&mut String::new()))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
    }
    let start = Instant::now();
    let end = start + s.duration;
    let next = Arc::new(AtomicUsize::new(0));
    let record = Arc::new(Mutex::new(Record::default()));
    let period = 1.0 / s.rate;
    let mut tasks = Vec::new();
    for mut conn in conns {
        let (requests, prepared, next, record) = (
            Arc::clone(requests),
            Arc::clone(prepared),
            Arc::clone(&next),
            Arc::clone(&record),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let slot = next.fetch_add(1, Ordering::Relaxed);
                let at = start + Duration::from_secs_f64(slot as f64 * period);
                if at >= end {
                    return;
                }
                tokio::time::sleep_until(at.into()).await;
                let sent = Instant::now();
                let result = conn.call(&requests, &prepared, slot, timeout).await;
                let took = sent.elapsed();
                let mut r = record.lock().unwrap_or_else(|e| e.into_inner());
                if sent.duration_since(at) > LATE {
                    r.late += 1;
                }
                match result {
                    Ok(t) => r.done.push((
                        slot,
                        sent.duration_since(start).as_micros() as u64,
                        took.as_micros() as u64,
                        t.queue_ms.unwrap_or(f64::NAN),
                        t.inference_ms.unwrap_or(f64::NAN),
                    )),
                    Err(e) => r.errors.push(e),
                }
            }
        }));
    }
    for t in tasks {
        t.await.map_err(|e| e.to_string())?;
    }
    let mut r = std::mem::take(&mut *record.lock().unwrap_or_else(|e| e.into_inner()));
    r.done.sort_unstable_by_key(|d| d.0);
    // NaN (no header) is written as null.
    let opt = |v: f64| (!v.is_nan()).then_some(v);
    Ok(json!({
        "rate": s.rate,
        "connections": s.connections,
        "duration_s": s.duration.as_secs_f64(),
        "count": r.done.len(),
        "errors": r.errors.len(),
        "first_error": r.errors.first(),
        "late": r.late,
        "sent_us": r.done.iter().map(|d| d.1).collect::<Vec<_>>(),
        "latencies_us": r.done.iter().map(|d| d.2).collect::<Vec<_>>(),
        "server_queue_ms": r.done.iter().map(|d| opt(d.3)).collect::<Vec<_>>(),
        "server_inference_ms": r.done.iter().map(|d| opt(d.4)).collect::<Vec<_>>(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_schedule_sends_its_slots_against_a_null_server() {
        let target = crate::null::http().await.unwrap().to_string();
        let requests = Arc::new(Requests::Http(
            "/v1/embeddings".into(),
            vec![b"{\"input\":\"a\"}".to_vec()],
        ));
        let prepared = Arc::new(vec![crate::http::Client::prepare(
            "/v1/embeddings",
            b"{\"input\":\"a\"}",
        )]);
        let s = Schedule {
            rate: 200.0,
            duration: Duration::from_millis(250),
            connections: 4,
            go_stdin: false,
        };
        let out = run(&target, &requests, &prepared, &s, Duration::from_secs(5))
            .await
            .unwrap();
        // Slots 0..50 fall inside 250 ms at 200/s.
        assert_eq!(out["count"], 50, "{out}");
        assert_eq!(out["errors"], 0);
        assert_eq!(out["latencies_us"].as_array().unwrap().len(), 50);
        let sent: Vec<u64> = serde_json::from_value(out["sent_us"].clone()).unwrap();
        assert!(sent.windows(2).all(|w| w[0] <= w[1]), "{sent:?}");
    }
}
