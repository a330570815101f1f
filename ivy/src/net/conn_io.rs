//! A client connection's socket with deadlines, so slow or hostile clients
//! cannot hold a connection open for free:
//! - a request head must arrive within the header timeout (counted from the
//!   connection's start, or from the first byte of a later request);
//! - a keep-alive connection may sit idle between requests for the idle
//!   timeout;
//! - a write that makes no progress (a client that stops reading its
//!   response) fails after the write timeout.
//!
//! The read deadlines only run while no request is being handled: a request
//! waiting for a replica is bounded by --request-timeout, not by these.
//! The connection's slot (see `listener.rs`) is held until the socket drops.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, Sleep};

/// The per-connection deadlines (from `--header-timeout`, `--idle-timeout`,
/// `--write-timeout`).
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub header: Duration,
    pub idle: Duration,
    pub write: Duration,
}

/// Requests being handled on one connection, counted by the service that
/// handles them (`Activity::enter`) and read by the socket's deadlines.
#[derive(Debug, Default)]
pub struct Activity {
    busy: AtomicUsize,
    /// Requests started so far: a change tells the socket that a request
    /// came and went between two of its reads.
    started: AtomicU64,
    /// The reader parked without a deadline while a request was handled:
    /// woken when the last one ends, so the idle deadline starts then (the
    /// socket itself may never wake it).
    parked: Mutex<Option<Waker>>,
}

/// Marks a request as being handled while alive.
pub struct Busy(Arc<Activity>);

impl Activity {
    pub fn enter(self: &Arc<Self>) -> Busy {
        self.started.fetch_add(1, Ordering::AcqRel);
        self.busy.fetch_add(1, Ordering::AcqRel);
        Busy(Arc::clone(self))
    }

    fn is_busy(&self) -> bool {
        self.busy.load(Ordering::Acquire) > 0
    }

    fn park(&self, waker: &Waker) {
        let mut parked = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        match parked.as_mut() {
            Some(w) if w.will_wake(waker) => {}
            _ => *parked = Some(waker.clone()),
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if self.0.busy.fetch_sub(1, Ordering::AcqRel) == 1 {
            let parked = self
                .0
                .parked
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            if let Some(waker) = parked {
                waker.wake();
            }
        }
    }
}

/// What the read deadlines watch.
pub enum Watch {
    /// HTTP/1: request heads and the idle time between requests.
    Requests(Arc<Activity>),
    /// HTTP/2 (gRPC): only the client's preface, this many bytes, must
    /// arrive within the header timeout; afterwards the HTTP/2 keepalive
    /// pings police the connection.
    Preface(usize),
}

/// Where a connection stands, for the read deadline.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Receiving a request head (or a preface) since then.
    Head(Instant),
    /// Between requests since then.
    Idle(Instant),
    /// A request is being handled, or the preface is in: no read deadline.
    Free,
}

pub struct ConnIo<T> {
    inner: T,
    timeouts: Timeouts,
    watch: Watch,
    phase: Phase,
    /// `Activity::started` when `phase` was last set.
    seen: u64,
    read_timer: Option<Pin<Box<Sleep>>>,
    write_timer: Option<Pin<Box<Sleep>>>,
    /// Whether the write timer runs (a write is stalled).
    write_stalled: bool,
    _slot: Option<OwnedSemaphorePermit>,
}

impl<T> ConnIo<T> {
    pub fn new(
        inner: T,
        timeouts: Timeouts,
        watch: Watch,
        slot: Option<OwnedSemaphorePermit>,
    ) -> Self {
        Self {
            inner,
            timeouts,
            watch,
            phase: Phase::Head(Instant::now()),
            seen: 0,
            read_timer: None,
            write_timer: None,
            write_stalled: false,
            _slot: slot,
        }
    }

    /// The deadline for the next byte, if one runs now.
    fn read_deadline(&mut self, cx: &Context<'_>) -> Option<Instant> {
        if let Watch::Requests(activity) = &self.watch {
            let started = activity.started.load(Ordering::Acquire);
            if activity.is_busy() {
                activity.park(cx.waker());
                // The request may have ended just before parking.
                if !activity.is_busy() {
                    cx.waker().wake_by_ref();
                }
                self.phase = Phase::Free;
            } else if self.phase == Phase::Free || started != self.seen {
                self.phase = Phase::Idle(Instant::now());
            }
            self.seen = started;
        }
        match self.phase {
            Phase::Head(since) => Some(since + self.timeouts.header),
            Phase::Idle(since) => Some(since + self.timeouts.idle),
            Phase::Free => None,
        }
    }

    fn on_read(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        match &mut self.watch {
            Watch::Requests(_) => {
                if matches!(self.phase, Phase::Idle(_)) {
                    self.phase = Phase::Head(Instant::now());
                }
            }
            Watch::Preface(left) => {
                *left = left.saturating_sub(n);
                if *left == 0 {
                    self.phase = Phase::Free;
                }
            }
        }
    }
}

/// Polls a timer set to `deadline` (created or moved as needed).
fn expired(timer: &mut Option<Pin<Box<Sleep>>>, deadline: Instant, cx: &mut Context<'_>) -> bool {
    let sleep = match timer {
        Some(sleep) => {
            if sleep.deadline() != deadline {
                sleep.as_mut().reset(deadline);
            }
            sleep
        }
        None => timer.insert(Box::pin(tokio::time::sleep_until(deadline))),
    };
    sleep.as_mut().poll(cx).is_ready()
}

fn timed_out(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, format!("client too slow: {what}"))
}

impl<T: AsyncRead + Unpin> AsyncRead for ConnIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                this.on_read(buf.filled().len() - before);
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => match this.read_deadline(cx) {
                Some(deadline) if expired(&mut this.read_timer, deadline, cx) => {
                    Poll::Ready(Err(timed_out(match this.phase {
                        Phase::Idle(_) => "idle timeout",
                        _ => "header timeout",
                    })))
                }
                _ => Poll::Pending,
            },
        }
    }
}

impl<T: AsyncWrite + Unpin> ConnIo<T> {
    /// Runs a write-side poll under the write timeout: the timer starts when
    /// a write stalls and stops when one makes progress.
    fn write_poll<R>(
        &mut self,
        cx: &mut Context<'_>,
        poll: impl FnOnce(Pin<&mut T>, &mut Context<'_>) -> Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        match poll(Pin::new(&mut self.inner), cx) {
            Poll::Ready(r) => {
                self.write_stalled = false;
                Poll::Ready(r)
            }
            Poll::Pending => {
                let deadline = match (&self.write_timer, self.write_stalled) {
                    (Some(t), true) => t.deadline(),
                    _ => Instant::now() + self.timeouts.write,
                };
                self.write_stalled = true;
                if expired(&mut self.write_timer, deadline, cx) {
                    Poll::Ready(Err(timed_out("write timeout (the response is not read)")))
                } else {
                    Poll::Pending
                }
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ConnIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .write_poll(cx, |io, cx| io.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .write_poll(cx, |io, cx| io.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().write_poll(cx, |io, cx| io.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().write_poll(cx, |io, cx| io.poll_shutdown(cx))
    }
}

impl<T> tonic::transport::server::Connected for ConnIo<T> {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    // Real time (tokio's paused clock needs its test-util feature, which
    // would rebuild every dependency for the tests): short timeouts, and
    // assertions on what happens, plus "not before the deadline".
    const T: Timeouts = Timeouts {
        header: Duration::from_millis(200),
        idle: Duration::from_millis(600),
        write: Duration::from_millis(300),
    };

    fn conn(watch: Watch) -> (ConnIo<tokio::io::DuplexStream>, tokio::io::DuplexStream) {
        let (server, client) = tokio::io::duplex(64);
        (ConnIo::new(server, T, watch, None), client)
    }

    async fn read_until_error(io: &mut ConnIo<tokio::io::DuplexStream>) -> io::Error {
        let mut b = [0; 8];
        loop {
            if let Err(e) = io.read(&mut b).await {
                return e;
            }
        }
    }

    #[tokio::test]
    async fn a_silent_new_connection_times_out_on_its_head() {
        let (mut io, _client) = conn(Watch::Requests(Arc::default()));
        let started = Instant::now();
        assert_eq!(
            read_until_error(&mut io).await.kind(),
            io::ErrorKind::TimedOut
        );
        assert!(started.elapsed() >= T.header);
    }

    #[tokio::test]
    async fn no_read_deadline_while_a_request_is_handled_then_the_idle_one() {
        let activity = Arc::<Activity>::default();
        let (mut io, mut client) = conn(Watch::Requests(Arc::clone(&activity)));
        client.write_all(b"GET").await.unwrap();
        assert_eq!(io.read(&mut [0; 8]).await.unwrap(), 3);
        // The head is in; the request is handled for longer than any timeout.
        let busy = activity.enter();
        let read = tokio::spawn(async move {
            let r = io.read(&mut [0; 8]).await;
            (io, r)
        });
        tokio::time::sleep(T.idle * 2).await;
        assert!(!read.is_finished());
        client.write_all(b"x").await.unwrap();
        let (mut io, r) = read.await.unwrap();
        assert_eq!(r.unwrap(), 1);
        drop(busy);
        // Between requests: the idle timeout, longer than the header one.
        let started = Instant::now();
        let err = read_until_error(&mut io).await;
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(err.to_string().contains("idle"), "{err}");
        assert!(started.elapsed() >= T.idle);
    }

    #[tokio::test]
    async fn a_request_handled_between_two_reads_restarts_the_clock_and_wakes_the_reader() {
        let activity = Arc::<Activity>::default();
        let (mut io, _client) = conn(Watch::Requests(Arc::clone(&activity)));
        let busy = activity.enter();
        let read = tokio::spawn(async move {
            let started = Instant::now();
            let err = read_until_error(&mut io).await;
            (err, started.elapsed())
        });
        // Longer than the header timeout: the old head deadline must not
        // cut the connection once the request ends.
        tokio::time::sleep(T.header * 2).await;
        drop(busy);
        let (err, elapsed) = read.await.unwrap();
        assert!(err.to_string().contains("idle"), "{err}");
        assert!(elapsed >= T.header * 2 + T.idle);
    }

    #[tokio::test]
    async fn a_trickled_head_is_cut_at_the_header_timeout() {
        let (mut io, mut client) = conn(Watch::Requests(Arc::default()));
        let trickle = tokio::spawn(async move {
            while client.write_all(b"G").await.is_ok() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        let err = read_until_error(&mut io).await;
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(err.to_string().contains("header"), "{err}");
        drop(io);
        trickle.await.unwrap();
    }

    #[tokio::test]
    async fn after_the_preface_no_read_deadline_runs() {
        let (mut io, mut client) = conn(Watch::Preface(4));
        client.write_all(b"PRI ").await.unwrap();
        assert_eq!(io.read(&mut [0; 8]).await.unwrap(), 4);
        let read = tokio::spawn(async move { io.read(&mut [0; 8]).await.map(|_| ()) });
        tokio::time::sleep(T.idle * 2).await;
        assert!(!read.is_finished());
        read.abort();
    }

    #[tokio::test]
    async fn a_response_nobody_reads_fails_after_the_write_timeout() {
        let (mut io, _client) = conn(Watch::Requests(Arc::default()));
        let started = Instant::now();
        let err = io.write_all(&[0; 1024]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= T.write);
    }

    #[tokio::test]
    async fn a_slow_but_steady_reader_is_not_cut() {
        let (mut io, mut client) = conn(Watch::Requests(Arc::default()));
        let reader = tokio::spawn(async move {
            let mut b = [0; 64];
            let mut total = 0;
            while total < 1024 {
                tokio::time::sleep(Duration::from_millis(50)).await;
                total += client.read(&mut b).await.unwrap();
            }
        });
        // 16 short stalls: far past the write timeout in all.
        io.write_all(&[0; 1024]).await.unwrap();
        reader.await.unwrap();
    }
}
