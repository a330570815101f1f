//! The prepared requests, read once before anything is timed.

use std::path::Path;

use proto::tulip::v1::{EmbedRequest, OutputKind};
use serde::Deserialize;

use crate::Mode;

#[derive(Deserialize)]
struct GrpcRequest {
    token_ids: Vec<u32>,
    lengths: Vec<u32>,
}

#[derive(Deserialize)]
struct File {
    #[serde(default)]
    requests: Vec<GrpcRequest>,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    bodies: Vec<serde_json::Value>,
}

/// What the clients send, round-robin.
pub enum Requests {
    Grpc(Vec<EmbedRequest>),
    /// Path and the serialized bodies.
    Http(String, Vec<Vec<u8>>),
}

impl Requests {
    pub fn read(path: &Path, mode: Mode) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let file: File =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let out = match mode {
            Mode::Grpc => Requests::Grpc(
                file.requests
                    .into_iter()
                    .map(|r| EmbedRequest {
                        token_ids: r.token_ids,
                        lengths: r.lengths,
                        kind: OutputKind::Dense as i32,
                        ..Default::default()
                    })
                    .collect(),
            ),
            Mode::Http => Requests::Http(
                file.path.unwrap_or_else(|| "/v1/embeddings".into()),
                file.bodies
                    .iter()
                    .map(|b| b.to_string().into_bytes())
                    .collect(),
            ),
        };
        if out.len() == 0 {
            return Err(format!("{}: no requests for {mode:?}", path.display()));
        }
        Ok(out)
    }

    pub fn len(&self) -> usize {
        match self {
            Requests::Grpc(r) => r.len(),
            Requests::Http(_, b) => b.len(),
        }
    }
}
