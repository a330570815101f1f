//! `http-load URL BODY_FILE --connections 64 --seconds 10`: keeps that many
//! keep-alive HTTP/1.1 connections busy with the same JSON POST for a fixed
//! time and prints JSON (requests/s, latency percentiles, errors). A compiled
//! client, so that on a small machine the client is not what is measured.

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn arg(args: &[String], name: &str, default: u64) -> u64 {
    args.windows(2)
        .find(|w| w[0] == name)
        .map_or(default, |w| w[1].parse().expect("a number"))
}

/// Reads one response; returns its status. `buf` keeps bytes that arrived
/// past it (there are none with one request in flight per connection).
async fn read_response(stream: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<u16> {
    buf.clear();
    let mut chunk = [0u8; 16384];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = std::str::from_utf8(&buf[..end]).unwrap_or("");
            let status = head.get(9..12).and_then(|s| s.parse().ok()).unwrap_or(0);
            let length: usize = head
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0);
            while buf.len() < end + 4 + length {
                let n = stream.read(&mut chunk).await?;
                if n == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            return Ok(status);
        }
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

async fn connection(addr: String, request: Vec<u8>, until: Instant) -> (Vec<u32>, u64) {
    let mut micros = Vec::new();
    let mut errors = 0;
    let mut stream = match TcpStream::connect(&addr).await {
        Ok(s) => s,
        Err(_) => return (micros, 1),
    };
    let _ = stream.set_nodelay(true);
    let mut buf = Vec::with_capacity(32768);
    while Instant::now() < until {
        let start = Instant::now();
        if stream.write_all(&request).await.is_err() {
            return (micros, errors + 1);
        }
        match read_response(&mut stream, &mut buf).await {
            Ok(200) => micros.push(start.elapsed().as_micros() as u32),
            Ok(_) => errors += 1,
            Err(_) => return (micros, errors + 1),
        }
    }
    (micros, errors)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let (url, body_file) = match (args.get(1), args.get(2)) {
        (Some(u), Some(b)) => (u.clone(), b.clone()),
        _ => return Err("usage: http-load http://HOST:PORT/PATH BODY_FILE [--connections N] [--seconds S] [--threads T]".into()),
    };
    let rest = url.strip_prefix("http://").ok_or("only http:// URLs")?;
    let (addr, path) = rest
        .split_once('/')
        .map_or((rest, "/".to_string()), |(a, p)| (a, format!("/{p}")));
    let body = std::fs::read(&body_file)?;
    let mut request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(&body);
    let connections = arg(&args, "--connections", 64) as usize;
    let seconds = arg(&args, "--seconds", 10);
    let mut rt = tokio::runtime::Builder::new_multi_thread();
    if let t @ 1.. = arg(&args, "--threads", 0) {
        rt.worker_threads(t as usize);
    }
    let rt = rt.enable_all().build()?;
    let started = Instant::now();
    let until = started + Duration::from_secs(seconds);
    let results = rt.block_on(async {
        let tasks: Vec<_> = (0..connections)
            .map(|_| tokio::spawn(connection(addr.to_string(), request.clone(), until)))
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap_or_default());
        }
        out
    });
    let elapsed = started.elapsed().as_secs_f64();
    let errors: u64 = results.iter().map(|r| r.1).sum();
    let mut micros: Vec<u32> = results.into_iter().flat_map(|r| r.0).collect();
    micros.sort_unstable();
    let pct = |q: f64| {
        micros
            .get(((micros.len() as f64 - 1.0) * q) as usize)
            .copied()
            .unwrap_or(0) as f64
            / 1e3
    };
    println!(
        "{}",
        serde_json::json!({
            "connections": connections, "seconds": elapsed, "requests": micros.len(), "errors": errors,
            "requests_per_s": micros.len() as f64 / elapsed,
            "p50_ms": pct(0.5), "p90_ms": pct(0.9), "p99_ms": pct(0.99),
        })
    );
    Ok(())
}
