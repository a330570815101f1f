//! The Batch API's bytes: uploaded files, output and error files, and the
//! checkpointed chunks of output they are assembled from. Kept in a local
//! directory (`dir.rs`, `--batch-dir`) or an S3-compatible object store
//! (`object.rs`, `--batch-object-store-url`). Keys are built here from
//! checked ids only; a reader never sees half of a blob.

mod dir;
mod object;

use std::path::Path;

use self::dir::Dir;
use self::object::Object;
use crate::error::ApiError;

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::Internal(format!("batch files: {e}"))
}

#[derive(Clone)]
pub enum Blobs {
    Dir(Dir),
    Object(Object),
}

/// A file being uploaded: written as it streams in, kept by `commit`.
pub enum Upload {
    Dir(dir::Upload),
    Object(object::Upload),
}

impl Upload {
    pub async fn write(&mut self, bytes: &[u8]) -> Result<(), ApiError> {
        match self {
            Upload::Dir(u) => u.write(bytes).await,
            Upload::Object(u) => u.write(bytes).await,
        }
    }

    /// Keeps the upload as the file it was started for.
    pub async fn commit(self) -> Result<(), ApiError> {
        match self {
            Upload::Dir(u) => u.commit().await,
            Upload::Object(u) => u.commit().await,
        }
    }

    /// Drops what was written.
    pub async fn abort(self) {
        match self {
            Upload::Dir(u) => u.abort().await,
            Upload::Object(u) => u.abort().await,
        }
    }
}

impl Blobs {
    pub fn open_dir(root: &Path) -> Result<Self, String> {
        Dir::open(root).map(Blobs::Dir)
    }

    pub fn open_object_store(url: &str) -> Result<Self, String> {
        Object::open(url).map(Blobs::Object)
    }

    /// The key of a chunk's output (`kind`: `out` or `err`); it starts with
    /// the batch's id.
    pub fn part_key(batch: &str, shard: i64, first_line: i64, kind: &str) -> String {
        format!(
            "{batch}.{shard}.{first_line}.{}.{kind}",
            super::ids::new("").as_str()
        )
    }

    /// Starts writing file `id` (a checked id).
    pub async fn upload(&self, id: &str) -> Result<Upload, ApiError> {
        Ok(match self {
            Blobs::Dir(d) => Upload::Dir(d.upload(id).await?),
            Blobs::Object(o) => Upload::Object(o.upload(id).await?),
        })
    }

    /// File `id`'s bytes as a response body.
    pub async fn stream(&self, id: &str) -> Result<axum::body::Body, ApiError> {
        match self {
            Blobs::Dir(d) => d.stream(id).await,
            Blobs::Object(o) => o.stream(id).await,
        }
    }

    /// Writes `bytes` as chunk blob `key`, durably.
    pub async fn put_part(&self, key: String, bytes: Vec<u8>) -> Result<(), ApiError> {
        match self {
            Blobs::Dir(d) => d.put_part(key, bytes).await,
            Blobs::Object(o) => o.put_part(key, bytes).await,
        }
    }

    /// Bytes `[start, end)` of file `id`.
    pub async fn read_range(&self, id: &str, start: u64, end: u64) -> Result<Vec<u8>, ApiError> {
        match self {
            Blobs::Dir(d) => d.read_range(id, start, end).await,
            Blobs::Object(o) => o.read_range(id, start, end).await,
        }
    }

    pub async fn read_file(&self, id: &str) -> Result<Vec<u8>, ApiError> {
        match self {
            Blobs::Dir(d) => d.read_file(id).await,
            Blobs::Object(o) => o.read_file(id).await,
        }
    }

    /// Writes file `id` as the concatenation of chunk blobs `keys` (plus
    /// `tail`), durably; its size in bytes.
    pub async fn concat_parts(
        &self,
        id: &str,
        keys: Vec<String>,
        tail: Vec<u8>,
    ) -> Result<u64, ApiError> {
        match self {
            Blobs::Dir(d) => d.concat_parts(id, keys, tail).await,
            Blobs::Object(o) => o.concat_parts(id, keys, tail).await,
        }
    }

    /// Deletes every chunk blob of `batch` (after its end is recorded;
    /// also those a holder wrote but never recorded).
    pub async fn delete_parts(&self, batch: &str) {
        match self {
            Blobs::Dir(d) => d.delete_parts(batch).await,
            Blobs::Object(o) => o.delete_parts(batch).await,
        }
    }

    pub async fn delete_file(&self, id: &str) {
        match self {
            Blobs::Dir(d) => d.delete_file(id).await,
            Blobs::Object(o) => o.delete_file(id).await,
        }
    }
}
