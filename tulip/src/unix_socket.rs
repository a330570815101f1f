//! Tulip's Unix socket: gRPC and Tulip frames on one path. A connection's
//! first four bytes tell them apart (HTTP/2 opens with `PRI `, frames with
//! `TLPF`), so a co-located gateway needs no second address.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use proto::frames;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, UdsConnectInfo};

use crate::service::TulipService;

/// A connection that sends nothing for this long is dropped unread.
const FIRST_BYTES: Duration = Duration::from_secs(10);

/// Accepts on `listener` until `stop`: frames connections are served here,
/// gRPC ones come out of the returned stream (for tonic's server).
pub fn accept(
    listener: UnixListener,
    service: Arc<TulipService>,
    max_message_bytes: usize,
    stop: watch::Receiver<bool>,
) -> ReceiverStream<io::Result<Sniffed>> {
    let (grpc, incoming) = mpsc::channel(64);
    tokio::spawn(async move {
        let mut stopping = stop.clone();
        loop {
            let stream = tokio::select! {
                r = listener.accept() => r,
                _ = stopping.wait_for(|s| *s) => return,
            };
            match stream {
                Ok((stream, _)) => {
                    let (service, stop, grpc) = (Arc::clone(&service), stop.clone(), grpc.clone());
                    tokio::spawn(async move {
                        route(stream, service, max_message_bytes, stop, grpc).await
                    });
                }
                // Out of descriptors and the like: the next accept may work.
                Err(e) => {
                    tracing::warn!(error = %e, "unix socket accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    });
    ReceiverStream::new(incoming)
}

async fn route(
    mut stream: UnixStream,
    service: Arc<TulipService>,
    max_message_bytes: usize,
    stop: watch::Receiver<bool>,
    grpc: mpsc::Sender<io::Result<Sniffed>>,
) {
    let mut head = [0u8; 4];
    match tokio::time::timeout(FIRST_BYTES, stream.read_exact(&mut head)).await {
        Ok(Ok(_)) => {}
        _ => return,
    }
    if head == frames::MAGIC {
        crate::frames::serve_connection(stream, service, max_message_bytes, stop).await;
    } else {
        let _ = grpc
            .send(Ok(Sniffed {
                head,
                given: 0,
                inner: stream,
            }))
            .await;
    }
}

/// A gRPC connection whose first bytes were read to route it: they are
/// read again first.
pub struct Sniffed {
    head: [u8; 4],
    given: usize,
    inner: UnixStream,
}

impl AsyncRead for Sniffed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.given < this.head.len() {
            let n = (this.head.len() - this.given).min(buf.remaining());
            buf.put_slice(&this.head[this.given..this.given + n]);
            this.given += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Sniffed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl Connected for Sniffed {
    type ConnectInfo = UdsConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}
