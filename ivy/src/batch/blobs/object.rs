//! The Batch API's bytes in an S3-compatible object store
//! (`--batch-object-store-url s3://bucket/prefix`, credentials and endpoint
//! from the usual `AWS_*` variables): files under `<prefix>/files/`, chunks
//! of output under `<prefix>/parts/<batch>/`. An object appears whole or
//! not at all; uploads and output files go up in multipart parts, so
//! neither is held in memory.

use std::sync::Arc;

use futures_util::StreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};

use super::internal;
use crate::error::ApiError;

/// Bytes per multipart part (S3's smallest but the last is 5 MiB).
const PART_BYTES: usize = 8 << 20;
/// Parts in flight per upload.
const PARTS_IN_FLIGHT: usize = 4;

#[derive(Clone)]
pub struct Object {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
}

/// An upload going up in parts.
pub struct Upload {
    writer: WriteMultipart,
}

impl Upload {
    pub async fn write(&mut self, bytes: &[u8]) -> Result<(), ApiError> {
        self.writer
            .wait_for_capacity(PARTS_IN_FLIGHT)
            .await
            .map_err(internal)?;
        self.writer.write(bytes);
        Ok(())
    }

    pub async fn commit(self) -> Result<(), ApiError> {
        self.writer.finish().await.map(drop).map_err(internal)
    }

    pub async fn abort(self) {
        let _ = self.writer.abort().await;
    }
}

impl Object {
    /// `url`: `s3://bucket` or `s3://bucket/prefix`.
    pub fn open(url: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("--batch-object-store-url {url:?}: {why}");
        let rest = url
            .strip_prefix("s3://")
            .ok_or_else(|| bad("give s3://bucket or s3://bucket/prefix"))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad("no bucket"));
        }
        let store = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .build()
            .map_err(|e| bad(&e.to_string()))?;
        Ok(Self {
            store: Arc::new(store),
            prefix: Path::from(prefix),
        })
    }

    fn path(&self, parts: &[&str]) -> Path {
        parts
            .iter()
            .fold(self.prefix.clone(), |p, part| p.clone().join(*part))
    }

    fn file_path(&self, id: &str) -> Path {
        self.path(&["files", id])
    }

    /// A chunk's key starts with its batch's id (`blobs::part_key`).
    fn part_path(&self, key: &str) -> Path {
        let batch = key.split('.').next().unwrap_or(key);
        self.path(&["parts", batch, key])
    }

    pub async fn upload(&self, id: &str) -> Result<Upload, ApiError> {
        let upload = self
            .store
            .put_multipart(&self.file_path(id))
            .await
            .map_err(internal)?;
        Ok(Upload {
            writer: WriteMultipart::new_with_chunk_size(upload, PART_BYTES),
        })
    }

    pub async fn stream(&self, id: &str) -> Result<axum::body::Body, ApiError> {
        let got = self
            .store
            .get(&self.file_path(id))
            .await
            .map_err(internal)?;
        Ok(axum::body::Body::from_stream(got.into_stream()))
    }

    pub async fn put_part(&self, key: String, bytes: Vec<u8>) -> Result<(), ApiError> {
        self.store
            .put(&self.part_path(&key), PutPayload::from(bytes))
            .await
            .map(drop)
            .map_err(internal)
    }

    pub async fn read_range(&self, id: &str, start: u64, end: u64) -> Result<Vec<u8>, ApiError> {
        self.store
            .get_range(&self.file_path(id), start..end)
            .await
            .map(|b| b.to_vec())
            .map_err(internal)
    }

    pub async fn read_file(&self, id: &str) -> Result<Vec<u8>, ApiError> {
        let got = self
            .store
            .get(&self.file_path(id))
            .await
            .map_err(internal)?;
        got.bytes().await.map(|b| b.to_vec()).map_err(internal)
    }

    /// Writes file `id` as the chunks `keys` in order, then `tail`,
    /// streamed part by part; its size in bytes.
    pub async fn concat_parts(
        &self,
        id: &str,
        keys: Vec<String>,
        tail: Vec<u8>,
    ) -> Result<u64, ApiError> {
        let mut up = self.upload(id).await?;
        let mut n = 0u64;
        let written = async {
            for k in &keys {
                let mut s = self
                    .store
                    .get(&self.part_path(k))
                    .await
                    .map_err(internal)?
                    .into_stream();
                while let Some(bytes) = s.next().await {
                    let bytes = bytes.map_err(internal)?;
                    n += bytes.len() as u64;
                    up.write(&bytes).await?;
                }
            }
            up.write(&tail).await?;
            n += tail.len() as u64;
            Ok::<_, ApiError>(())
        }
        .await;
        match written {
            Ok(()) => up.commit().await.map(|()| n),
            Err(e) => {
                up.abort().await;
                Err(e)
            }
        }
    }

    /// Deletes every chunk of `batch`.
    pub async fn delete_parts(&self, batch: &str) {
        let dir = self.path(&["parts", batch]);
        let listed: Vec<_> = self.store.list(Some(&dir)).collect().await;
        for meta in listed.into_iter().flatten() {
            let _ = self.store.delete(&meta.location).await;
        }
    }

    pub async fn delete_file(&self, id: &str) {
        let _ = self.store.delete(&self.file_path(id)).await;
    }
}
