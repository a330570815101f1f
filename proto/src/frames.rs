//! Tulip frames: `Embed` calls from a co-located gateway over Tulip's Unix
//! socket without HTTP/2. The messages are the same `tulip.v1` protobufs;
//! only the envelope is thinner. A unary gRPC call is three writes out
//! (HEADERS, DATA, an empty END_STREAM) and two back, each through hyper's
//! and h2's state machines; a frame is one write each way. `python -m bench
//! overhead` times both bare pairs side by side (`hop_floor` in its JSON).
//!
//! A connection opens with [`PREFACE`] (magic + version); Tulip tells it
//! from gRPC's `PRI * HTTP/2.0` by its first four bytes. Then, both ways,
//! frames of `u32 length` (little-endian, the bytes after it) + body:
//! - call, gateway → Tulip: `u8 type`, `u64 tag`, then for [`EMBED`] a
//!   `u16`-length `traceparent` (empty: none) and the `EmbedRequest`;
//!   [`CANCEL`] has nothing more (the caller went away: drop that call).
//! - reply, Tulip → gateway: `u64 tag`, `u8` gRPC status code, `u8` flags
//!   ([`DRAINING`]), then the `EmbedResponse` (code 0) or the error message.
//!
//! Replies come back in any order; the tag pairs them with their calls.
//! Errors carry the same codes (and the draining mark) as the gRPC status
//! would, so a gateway classifies them one way for both transports.

use prost::Message;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tonic::metadata::MetadataValue;
use tonic::{Code, Status};

use crate::tulip::v1::{EmbedRequest, EmbedResponse, DRAINING_METADATA};

/// The first bytes of a frames connection: magic, then the version.
pub const MAGIC: [u8; 4] = *b"TLPF";
pub const VERSION: u32 = 1;
pub const PREFACE: [u8; 8] = [b'T', b'L', b'P', b'F', 1, 0, 0, 0];

/// Call types.
pub const EMBED: u8 = 1;
pub const CANCEL: u8 = 2;
/// Reply flag: the refusal is from a draining server (gRPC's
/// `tulip-draining` metadata).
pub const DRAINING: u8 = 1;

/// Bytes of a call body before its payload: type and tag.
pub const CALL_HEAD: usize = 9;

/// A decoded call.
#[derive(Debug)]
pub enum Call {
    Embed {
        tag: u64,
        traceparent: String,
        request: EmbedRequest,
    },
    Cancel {
        tag: u64,
    },
}

/// Appends an `Embed` call frame to `out`.
pub fn encode_embed(tag: u64, traceparent: &str, request: &EmbedRequest, out: &mut Vec<u8>) {
    let tp = &traceparent.as_bytes()[..traceparent.len().min(u16::MAX as usize)];
    let body = CALL_HEAD + 2 + tp.len() + request.encoded_len();
    out.reserve(4 + body);
    out.extend_from_slice(&(body as u32).to_le_bytes());
    out.push(EMBED);
    out.extend_from_slice(&tag.to_le_bytes());
    out.extend_from_slice(&(tp.len() as u16).to_le_bytes());
    out.extend_from_slice(tp);
    request.encode(out).expect("a Vec grows to fit the message");
}

/// Appends a `Cancel` call frame to `out`.
pub fn encode_cancel(tag: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(&(CALL_HEAD as u32).to_le_bytes());
    out.push(CANCEL);
    out.extend_from_slice(&tag.to_le_bytes());
}

/// The type and tag at the start of a call body, when it is long enough.
pub fn call_head(body: &[u8]) -> Option<(u8, u64)> {
    let head = body.get(..CALL_HEAD)?;
    Some((head[0], u64::from_le_bytes(head[1..9].try_into().ok()?)))
}

/// Decodes a call body (the bytes after its length).
pub fn decode_call(body: &[u8]) -> Result<Call, String> {
    let (kind, tag) = call_head(body).ok_or("a frame shorter than its header")?;
    match kind {
        CANCEL => Ok(Call::Cancel { tag }),
        EMBED => {
            let rest = &body[CALL_HEAD..];
            let tp_len = rest
                .get(..2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]) as usize)
                .ok_or("an Embed frame without its traceparent length")?;
            let tp = rest
                .get(2..2 + tp_len)
                .ok_or("an Embed frame shorter than its traceparent")?;
            let traceparent =
                String::from_utf8(tp.to_vec()).map_err(|_| "a traceparent that is not UTF-8")?;
            let request = EmbedRequest::decode(&rest[2 + tp_len..])
                .map_err(|e| format!("an EmbedRequest that does not decode: {e}"))?;
            Ok(Call::Embed {
                tag,
                traceparent,
                request,
            })
        }
        other => Err(format!("unknown call type {other}")),
    }
}

/// Appends a reply frame to `out`: the answer, or the status it failed with.
pub fn encode_reply(tag: u64, outcome: Result<&EmbedResponse, &Status>, out: &mut Vec<u8>) {
    let (code, flags, payload_len) = match outcome {
        Ok(resp) => (0u8, 0u8, resp.encoded_len()),
        Err(status) => {
            let draining = if status.metadata().contains_key(DRAINING_METADATA) {
                DRAINING
            } else {
                0
            };
            (status.code() as i32 as u8, draining, status.message().len())
        }
    };
    let body = 8 + 2 + payload_len;
    out.reserve(4 + body);
    out.extend_from_slice(&(body as u32).to_le_bytes());
    out.extend_from_slice(&tag.to_le_bytes());
    out.push(code);
    out.push(flags);
    match outcome {
        Ok(resp) => resp.encode(out).expect("a Vec grows to fit the message"),
        Err(status) => out.extend_from_slice(status.message().as_bytes()),
    }
}

/// Decodes a reply body: its tag and the answer or the status.
pub fn decode_reply(body: &[u8]) -> Result<(u64, Result<EmbedResponse, Status>), String> {
    if body.len() < 10 {
        return Err("a reply shorter than its header".into());
    }
    let tag = u64::from_le_bytes(body[..8].try_into().expect("8 bytes"));
    let (code, flags, payload) = (body[8], body[9], &body[10..]);
    if code == 0 {
        let resp = EmbedResponse::decode(payload)
            .map_err(|e| format!("an EmbedResponse that does not decode: {e}"))?;
        return Ok((tag, Ok(resp)));
    }
    let mut status = Status::new(
        Code::from_i32(code as i32),
        String::from_utf8_lossy(payload).into_owned(),
    );
    if flags & DRAINING != 0 {
        status
            .metadata_mut()
            .insert(DRAINING_METADATA, MetadataValue::from_static("1"));
    }
    Ok((tag, Err(status)))
}

/// One frame read from `r`.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame {
    /// The body is in the buffer.
    Body,
    /// The body was longer than allowed and was read past (not kept): its
    /// first bytes (a call's type and tag, when that long) and its length.
    TooLong { head: Vec<u8>, len: usize },
    /// The peer closed the connection between frames.
    End,
}

/// Reads the next frame's body into `buf` (replacing its contents). A body
/// over `max` bytes is skipped, so one oversized call gets an answer
/// instead of costing the connection.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Frame> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(Frame::End),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len) as usize;
    buf.clear();
    if len > max {
        let keep = len.min(CALL_HEAD);
        buf.resize(keep, 0);
        r.read_exact(buf).await?;
        let head = std::mem::take(buf);
        let skipped = tokio::io::copy(
            &mut (&mut *r).take((len - keep) as u64),
            &mut tokio::io::sink(),
        )
        .await?;
        if skipped as usize != len - keep {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        return Ok(Frame::TooLong { head, len });
    }
    buf.resize(len, 0);
    r.read_exact(buf).await?;
    Ok(Frame::Body)
}

/// Writes the frames sent on `frames` to `w` until every sender is gone or
/// a write fails. Frames queued together go out in one write.
pub async fn write_frames<W: AsyncWrite + Unpin>(
    mut w: W,
    mut frames: mpsc::UnboundedReceiver<Vec<u8>>,
) -> std::io::Result<()> {
    /// Gathering stops here: a big reply goes out on its own.
    const GATHER: usize = 256 * 1024;
    while let Some(first) = frames.recv().await {
        let mut batch = first;
        while batch.len() < GATHER {
            match frames.try_recv() {
                Ok(more) => batch.extend_from_slice(&more),
                Err(_) => break,
            }
        }
        w.write_all(&batch).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> EmbedRequest {
        EmbedRequest {
            token_ids: vec![101, 2023, 102],
            lengths: vec![3],
            request_id: "r-1".into(),
            ..Default::default()
        }
    }

    #[test]
    fn calls_round_trip() {
        let mut out = Vec::new();
        encode_embed(7, "00-abc-def-01", &request(), &mut out);
        encode_cancel(9, &mut out);
        let first = u32::from_le_bytes(out[..4].try_into().unwrap()) as usize;
        match decode_call(&out[4..4 + first]).unwrap() {
            Call::Embed {
                tag,
                traceparent,
                request: r,
            } => {
                assert_eq!((tag, traceparent.as_str()), (7, "00-abc-def-01"));
                assert_eq!(r, request());
            }
            other => panic!("{other:?}"),
        }
        let rest = &out[4 + first..];
        assert_eq!(
            u32::from_le_bytes(rest[..4].try_into().unwrap()) as usize,
            rest.len() - 4
        );
        assert!(matches!(
            decode_call(&rest[4..]).unwrap(),
            Call::Cancel { tag: 9 }
        ));
    }

    #[test]
    fn replies_carry_answers_codes_and_the_draining_mark() {
        let resp = EmbedResponse {
            rows: 1,
            dim: 2,
            data: vec![0, 0, 0, 63, 0, 0, 128, 62].into(),
            ..Default::default()
        };
        let mut out = Vec::new();
        encode_reply(3, Ok(&resp), &mut out);
        let (tag, got) = decode_reply(&out[4..]).unwrap();
        assert_eq!((tag, got.unwrap()), (3, resp));

        let mut draining = Status::unavailable("server is draining");
        draining
            .metadata_mut()
            .insert(DRAINING_METADATA, MetadataValue::from_static("1"));
        for (status, marked) in [
            (draining, true),
            (Status::internal("engine error: boom"), false),
        ] {
            out.clear();
            encode_reply(4, Err(&status), &mut out);
            let (_, got) = decode_reply(&out[4..]).unwrap();
            let got = got.unwrap_err();
            assert_eq!(
                (got.code(), got.message()),
                (status.code(), status.message())
            );
            assert_eq!(got.metadata().contains_key(DRAINING_METADATA), marked);
        }
    }

    #[test]
    fn malformed_calls_are_errors_not_panics() {
        assert!(decode_call(&[]).is_err());
        assert!(decode_call(&[EMBED, 1, 0, 0, 0, 0, 0, 0, 0]).is_err());
        assert!(decode_call(&[EMBED, 1, 0, 0, 0, 0, 0, 0, 0, 200, 0, 1]).is_err());
        assert!(decode_call(&[77, 1, 0, 0, 0, 0, 0, 0, 0])
            .unwrap_err()
            .contains("77"));
        let mut bad = vec![EMBED, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        bad.extend_from_slice(&[0xff; 5]);
        assert!(decode_call(&bad).is_err());
        assert!(decode_reply(&[1, 2, 3]).is_err());
    }

    #[tokio::test]
    async fn an_oversized_frame_is_skipped_and_the_next_one_read() {
        let mut wire = Vec::new();
        let mut big = request();
        big.token_ids = vec![1; 1000];
        encode_embed(5, "", &big, &mut wire);
        encode_cancel(6, &mut wire);
        let mut r = &wire[..];
        let mut buf = Vec::new();
        match read_frame(&mut r, &mut buf, 100).await.unwrap() {
            Frame::TooLong { head, len } => {
                assert_eq!(call_head(&head), Some((EMBED, 5)));
                assert!(len > 100);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            read_frame(&mut r, &mut buf, 100).await.unwrap(),
            Frame::Body
        );
        assert!(matches!(
            decode_call(&buf).unwrap(),
            Call::Cancel { tag: 6 }
        ));
        assert_eq!(read_frame(&mut r, &mut buf, 100).await.unwrap(), Frame::End);
    }
}
