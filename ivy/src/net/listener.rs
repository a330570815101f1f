//! A public listener: accepts while fewer than `--max-connections` client
//! connections are open (beyond, new ones wait in the kernel's accept queue
//! until one closes), performs the TLS handshake when configured, and wraps
//! each socket in its deadlines (`conn_io.rs`).

use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;

use crate::net::conn_io::{ConnIo, Timeouts, Watch};
use crate::net::tls::Stream;

/// The HTTP/2 client preface (`PRI * HTTP/2.0...`) a gRPC connection opens
/// with.
const H2_PREFACE_LEN: usize = 24;

/// Pause after a failed accept (e.g. out of file descriptors) so the loop
/// does not spin while the condition lasts.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

pub struct Listener {
    tcp: TcpListener,
    tls: Option<TlsAcceptor>,
    slots: Arc<Semaphore>,
    max: u32,
    /// Whether the last accept had to wait for a slot (logged once per episode).
    full: AtomicBool,
    timeouts: Timeouts,
    name: &'static str,
}

/// A client connection accepted, not yet handshaken.
pub struct Accepted {
    tcp: TcpStream,
    slot: OwnedSemaphorePermit,
    tls: Option<TlsAcceptor>,
    timeouts: Timeouts,
}

impl Listener {
    pub fn new(
        tcp: TcpListener,
        tls: Option<TlsAcceptor>,
        max_connections: u32,
        timeouts: Timeouts,
        name: &'static str,
    ) -> Self {
        Self {
            tcp,
            tls,
            slots: Arc::new(Semaphore::new(max_connections as usize)),
            max: max_connections,
            full: AtomicBool::new(false),
            timeouts,
            name,
        }
    }

    /// The next connection, once a slot is free.
    pub async fn accept(&self) -> Accepted {
        let slot = match Arc::clone(&self.slots).try_acquire_owned() {
            Ok(slot) => {
                if self.full.swap(false, Ordering::Relaxed) {
                    tracing::info!(listener = self.name, "below the connection limit again");
                }
                slot
            }
            Err(_) => {
                if !self.full.swap(true, Ordering::Relaxed) {
                    tracing::warn!(
                        listener = self.name,
                        max = self.max,
                        "connection limit reached; new connections wait until one closes"
                    );
                }
                Arc::clone(&self.slots)
                    .acquire_owned()
                    .await
                    .expect("the slots semaphore is never closed")
            }
        };
        loop {
            match self.tcp.accept().await {
                Ok((tcp, _)) => {
                    let _ = tcp.set_nodelay(true);
                    return Accepted {
                        tcp,
                        slot,
                        tls: self.tls.clone(),
                        timeouts: self.timeouts,
                    };
                }
                Err(e) => {
                    tracing::warn!(listener = self.name, error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                }
            }
        }
    }

    /// Connections as a stream for tonic, until `stop` resolves. TLS
    /// handshakes run off the accept loop, so a slow one delays no other.
    pub fn incoming(
        self,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> impl futures_util::Stream<Item = io::Result<ConnIo<Stream>>> + Send + 'static {
        // Unbounded is bounded here: each connection holds one of the slots.
        let (tx, mut rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            tokio::pin!(stop);
            loop {
                let accepted = tokio::select! {
                    biased;
                    _ = &mut stop => break,
                    accepted = self.accept() => accepted,
                };
                let tx = tx.clone();
                tokio::spawn(async move {
                    match accepted.open(Watch::Preface(H2_PREFACE_LEN)).await {
                        Ok(io) => {
                            let _ = tx.send(io);
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "gRPC connection closed in its TLS handshake")
                        }
                    }
                });
            }
        });
        futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|io| io.map(Ok)))
    }

    /// Stops accepting, then waits until every connection has closed.
    pub async fn close(self) {
        let Self {
            tcp, slots, max, ..
        } = self;
        drop(tcp);
        let _ = slots.acquire_many(max).await;
    }
}

impl Accepted {
    /// The connection ready to serve: TLS handshake done (within the header
    /// timeout), deadlines on.
    pub async fn open(self, watch: Watch) -> io::Result<ConnIo<Stream>> {
        let stream = match self.tls {
            None => Stream::Plain(self.tcp),
            Some(tls) => {
                let handshake = tokio::time::timeout(self.timeouts.header, tls.accept(self.tcp));
                match handshake.await {
                    Ok(Ok(s)) => Stream::Tls(Box::new(s)),
                    Ok(Err(e)) => return Err(e),
                    Err(_) => {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "client too slow: TLS handshake timeout",
                        ))
                    }
                }
            }
        };
        Ok(ConnIo::new(stream, self.timeouts, watch, Some(self.slot)))
    }
}
