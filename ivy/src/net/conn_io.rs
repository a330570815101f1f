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
mod tests;
