//! `Embed` calls to a co-located Tulip as Tulip frames (`proto::frames`)
//! over its Unix socket: one connection, many calls in flight on it, each
//! reply paired with its call by tag. Errors come back as the same
//! `tonic::Status` a gRPC call would give, so they are classified once.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use proto::frames::{self, Frame};
use proto::tulip::v1::{EmbedRequest, EmbedResponse};
use tokio::io::{AsyncWriteExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

use super::CONNECT_TIMEOUT;

type Reply = Result<EmbedResponse, Status>;

pub struct FrameClient {
    path: PathBuf,
    /// The connection calls go on; replaced when it breaks.
    conn: Mutex<Option<Arc<Conn>>>,
    /// One connect at a time.
    connecting: tokio::sync::Mutex<()>,
    max_reply_bytes: usize,
}

struct Conn {
    frames: mpsc::UnboundedSender<Vec<u8>>,
    next_tag: AtomicU64,
    /// Calls waiting for their reply; `None` once the connection broke.
    waiting: Mutex<Option<HashMap<u64, oneshot::Sender<Reply>>>>,
}

impl FrameClient {
    pub fn new(path: PathBuf, max_reply_bytes: usize) -> Self {
        Self {
            path,
            conn: Mutex::new(None),
            connecting: tokio::sync::Mutex::new(()),
            max_reply_bytes,
        }
    }

    /// One call. A caller that goes away cancels it on Tulip's side.
    pub async fn embed(&self, request: &EmbedRequest, traceparent: &str) -> Reply {
        let conn = self.connection().await?;
        let tag = conn.next_tag.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        match conn.waiting.lock().expect("waiting lock").as_mut() {
            Some(waiting) => waiting.insert(tag, tx),
            None => return Err(lost()),
        };
        let mut frame = Vec::new();
        frames::encode_embed(tag, traceparent, request, &mut frame);
        let pending = Pending {
            conn: &conn,
            tag,
            answered: false,
        };
        if conn.frames.send(frame).is_err() {
            return Err(lost());
        }
        let reply = rx.await.unwrap_or_else(|_| Err(lost()));
        pending.answered();
        reply
    }

    async fn connection(&self) -> Result<Arc<Conn>, Status> {
        if let Some(conn) = self.live() {
            return Ok(conn);
        }
        let _one = self.connecting.lock().await;
        if let Some(conn) = self.live() {
            return Ok(conn);
        }
        let conn = self.connect().await.map_err(|e| {
            Status::unavailable(format!("cannot connect to {}: {e}", self.path.display()))
        })?;
        *self.conn.lock().expect("conn lock") = Some(Arc::clone(&conn));
        Ok(conn)
    }

    fn live(&self) -> Option<Arc<Conn>> {
        let conn = self.conn.lock().expect("conn lock").clone()?;
        let alive = conn.waiting.lock().expect("waiting lock").is_some();
        alive.then_some(conn)
    }

    async fn connect(&self) -> std::io::Result<Arc<Conn>> {
        let mut stream = tokio::time::timeout(CONNECT_TIMEOUT, UnixStream::connect(&self.path))
            .await
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
        stream.write_all(&frames::PREFACE).await?;
        let (read, write) = stream.into_split();
        let (tx, rx) = mpsc::unbounded_channel();
        let conn = Arc::new(Conn {
            frames: tx,
            next_tag: AtomicU64::new(1),
            waiting: Mutex::new(Some(HashMap::new())),
        });
        // The tasks hold the connection weakly: once the client lets go of
        // it (replaced, or the replica removed), they end and close it.
        let writer = Arc::downgrade(&conn);
        tokio::spawn(async move {
            if let Err(e) = frames::write_frames(write, rx).await {
                if let Some(conn) = writer.upgrade() {
                    conn.close(&format!("write failed: {e}"));
                }
            }
        });
        let reader = Arc::downgrade(&conn);
        let max = self.max_reply_bytes;
        tokio::spawn(async move {
            let why = read_replies(BufReader::with_capacity(64 * 1024, read), &reader, max).await;
            tracing::debug!(reason = %why, "frames connection to Tulip closed");
            if let Some(conn) = reader.upgrade() {
                conn.close(&why);
            }
        });
        Ok(conn)
    }
}

impl Conn {
    /// Marks the connection broken: every call still waiting fails (and may
    /// retry elsewhere), and the next call connects again.
    fn close(&self, why: &str) {
        let waiting = self.waiting.lock().expect("waiting lock").take();
        for (_, call) in waiting.into_iter().flatten() {
            let _ = call.send(Err(Status::unavailable(format!(
                "connection to Tulip lost: {why}"
            ))));
        }
    }
}

/// Hands each reply to its call until the connection ends (or nobody holds
/// it any more); returns why.
async fn read_replies(
    mut r: BufReader<tokio::net::unix::OwnedReadHalf>,
    conn: &std::sync::Weak<Conn>,
    max: usize,
) -> String {
    let mut buf = Vec::new();
    loop {
        match frames::read_frame(&mut r, &mut buf, max).await {
            Ok(Frame::Body) => {}
            Ok(Frame::End) => return "closed by Tulip".into(),
            Ok(Frame::TooLong { len, .. }) => {
                return format!("a reply of {len} bytes is over the limit of {max}")
            }
            Err(e) => return e.to_string(),
        }
        let (tag, reply) = match frames::decode_reply(&buf) {
            Ok(r) => r,
            Err(e) => return e,
        };
        let Some(conn) = conn.upgrade() else {
            return "no longer used".into();
        };
        let call = match conn.waiting.lock().expect("waiting lock").as_mut() {
            Some(waiting) => waiting.remove(&tag),
            None => return "closed".into(),
        };
        // None: the caller went away; its reply is dropped.
        if let Some(call) = call {
            let _ = call.send(reply);
        }
    }
}

fn lost() -> Status {
    Status::unavailable("connection to Tulip lost")
}

/// A call sent and not answered yet: dropped unanswered (the caller went
/// away), it tells Tulip to drop the call.
struct Pending<'a> {
    conn: &'a Conn,
    tag: u64,
    answered: bool,
}

impl Pending<'_> {
    fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let was_waiting = self
            .conn
            .waiting
            .lock()
            .expect("waiting lock")
            .as_mut()
            .and_then(|w| w.remove(&self.tag))
            .is_some();
        if was_waiting {
            let mut frame = Vec::new();
            frames::encode_cancel(self.tag, &mut frame);
            let _ = self.conn.frames.send(frame);
        }
    }
}
