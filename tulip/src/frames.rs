//! Serves one Tulip frames connection (`proto::frames`): `Embed` calls from a
//! co-located gateway, answered by the same service as gRPC's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use proto::frames::{self, Call, Frame};
use tokio::io::{AsyncReadExt, BufReader};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, watch};
use tokio::task::AbortHandle;
use tonic::Status;

use crate::service::TulipService;

/// Calls in flight on one connection, by tag: a `Cancel` or the end of the
/// connection aborts them, as a reset stream does a gRPC call.
type InFlight = Arc<Mutex<HashMap<u64, AbortHandle>>>;

/// Serves a connection whose magic has been read, until the gateway closes
/// it, it breaks the protocol, or the server stops.
pub async fn serve_connection(
    stream: UnixStream,
    service: Arc<TulipService>,
    max_message_bytes: usize,
    mut stop: watch::Receiver<bool>,
) {
    let (read, write) = stream.into_split();
    let mut reader = BufReader::with_capacity(64 * 1024, read);
    let mut version = [0u8; 4];
    if reader.read_exact(&mut version).await.is_err() {
        return;
    }
    if u32::from_le_bytes(version) != frames::VERSION {
        tracing::warn!(
            version = u32::from_le_bytes(version),
            "frames connection with an unknown version; closed"
        );
        return;
    }
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(frames::write_frames(write, rx));
    let gauge = &service.metrics.frames_connections;
    gauge.inc();
    let calls = InFlight::default();
    let mut buf = Vec::new();
    loop {
        let frame = tokio::select! {
            f = frames::read_frame(&mut reader, &mut buf, max_message_bytes) => f,
            _ = stop.wait_for(|s| *s) => break,
        };
        match frame {
            Ok(Frame::Body) => match frames::decode_call(&buf) {
                Ok(Call::Embed {
                    tag,
                    traceparent,
                    request,
                }) => start_call(&service, &calls, &tx, tag, traceparent, request),
                Ok(Call::Cancel { tag }) => {
                    if let Some(call) = calls.lock().expect("calls lock").remove(&tag) {
                        call.abort();
                    }
                }
                Err(e) => match frames::call_head(&buf) {
                    // The envelope holds: only this call is bad.
                    Some((frames::EMBED, tag)) => refuse(
                        &tx,
                        tag,
                        Status::invalid_argument(format!("bad frame: {e}")),
                    ),
                    _ => {
                        tracing::warn!(error = %e, "frames connection broke the protocol; closed");
                        break;
                    }
                },
            },
            Ok(Frame::TooLong { head, len }) => match frames::call_head(&head) {
                Some((frames::EMBED, tag)) => refuse(
                    &tx,
                    tag,
                    Status::out_of_range(format!(
                        "a call of {len} bytes is over this server's limit of {max_message_bytes}"
                    )),
                ),
                _ => break,
            },
            Ok(Frame::End) => break,
            Err(e) => {
                tracing::debug!(error = %e, "frames connection failed");
                break;
            }
        }
    }
    for (_, call) in calls.lock().expect("calls lock").drain() {
        call.abort();
    }
    gauge.dec();
}

fn start_call(
    service: &Arc<TulipService>,
    calls: &InFlight,
    tx: &mpsc::UnboundedSender<Vec<u8>>,
    tag: u64,
    traceparent: String,
    request: proto::tulip::v1::EmbedRequest,
) {
    let (service, calls_of_task, tx) = (Arc::clone(service), Arc::clone(calls), tx.clone());
    // Held across the spawn, so the task cannot remove its tag before it
    // is there.
    let mut in_flight = calls.lock().expect("calls lock");
    let task = tokio::spawn(async move {
        let outcome = service
            .answer(request, |span| {
                telemetry::continue_traceparent(span, &traceparent)
            })
            .await;
        let mut out = Vec::new();
        match outcome {
            Ok(resp) => frames::encode_reply(tag, Ok(&resp), &mut out),
            Err(e) => frames::encode_reply(tag, Err(&Status::from(e)), &mut out),
        }
        calls_of_task.lock().expect("calls lock").remove(&tag);
        let _ = tx.send(out);
    });
    in_flight.insert(tag, task.abort_handle());
}

fn refuse(tx: &mpsc::UnboundedSender<Vec<u8>>, tag: u64, status: Status) {
    let mut out = Vec::new();
    frames::encode_reply(tag, Err(&status), &mut out);
    let _ = tx.send(out);
}
