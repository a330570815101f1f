//! A minimal HTTP/1.1 keep-alive client: one connection, one request at a
//! time, bodies framed by Content-Length (what Ivy sends). Lean on purpose:
//! it prepares the request bytes once and parses only what it must.

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// What the server said its parts took, when it said.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timing {
    pub queue_ms: Option<f64>,
    pub inference_ms: Option<f64>,
}

pub struct Client {
    target: String,
    stream: TcpStream,
    buf: Vec<u8>,
    /// A response came back on this connection (so the server may close
    /// it while idle, as keep-alive servers do).
    used: bool,
}

impl Client {
    pub async fn connect(target: &str) -> Result<Self, String> {
        Ok(Self {
            target: target.to_owned(),
            stream: Self::open(target).await?,
            buf: Vec::with_capacity(1 << 16),
            used: false,
        })
    }

    async fn open(target: &str) -> Result<TcpStream, String> {
        let stream = TcpStream::connect(target)
            .await
            .map_err(|e| format!("connect {target}: {e}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        Ok(stream)
    }

    /// The bytes of one POST of `body` to `path`.
    pub fn prepare(path: &str, body: &[u8]) -> Vec<u8> {
        let mut req = format!(
            "POST {path} HTTP/1.1\r\nHost: loadgen\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .into_bytes();
        req.extend_from_slice(body);
        req
    }

    /// Sends a prepared request and reads the whole response; returns the
    /// status code and the server's own timing headers (Ivy's
    /// `x-queue-time` and `x-inference-time`, ms: what Tulip reported).
    /// A kept-alive connection the server closed while it was idle is
    /// replaced once, as every HTTP client does.
    pub async fn send_timed(&mut self, request: &[u8]) -> Result<(u16, Timing), String> {
        let (status, head_end) = match self.exchange(request).await {
            Err(_) if self.used => {
                self.stream = Self::open(&self.target).await?;
                self.used = false;
                self.exchange(request).await?
            }
            other => other?,
        };
        self.used = true;
        let head = std::str::from_utf8(&self.buf[..head_end]).map_err(|e| e.to_string())?;
        let header = |name: &str| -> Option<f64> {
            head.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case(name)
                    .then(|| v.trim().parse().ok())?
            })
        };
        Ok((
            status,
            Timing {
                queue_ms: header("x-queue-time"),
                inference_ms: header("x-inference-time"),
            },
        ))
    }

    async fn exchange(&mut self, request: &[u8]) -> Result<(u16, usize), String> {
        self.stream
            .write_all(request)
            .await
            .map_err(|e| e.to_string())?;
        self.buf.clear();
        let head_end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i + 4;
            }
            self.read_more().await?;
        };
        let head = std::str::from_utf8(&self.buf[..head_end]).map_err(|e| e.to_string())?;
        let status = head
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("bad status line: {head:?}"))?;
        let length: usize = head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .ok_or("response without Content-Length")?;
        while self.buf.len() < head_end + length {
            self.read_more().await?;
        }
        Ok((status, head_end))
    }

    async fn read_more(&mut self) -> Result<(), String> {
        let mut chunk = [0u8; 1 << 16];
        let n = self
            .stream
            .read(&mut chunk)
            .await
            .map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("connection closed mid-response".into());
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prepared_requests_carry_their_length() {
        let req = Client::prepare("/v1/embeddings", b"{\"input\":\"a\"}");
        let text = String::from_utf8(req).unwrap();
        assert!(text.starts_with("POST /v1/embeddings HTTP/1.1\r\n"));
        assert!(text.contains("Content-Length: 13\r\n\r\n{\"input\":\"a\"}"));
    }
}
