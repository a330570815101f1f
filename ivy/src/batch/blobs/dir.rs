//! The Batch API's bytes in a local directory (`--batch-dir`): uploaded
//! and output files under `files/`, checkpointed chunks of output under
//! `parts/`. A blob is written under a temporary name, synced, then
//! renamed, so a reader never sees half of one.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use tokio::io::AsyncWriteExt;

use super::internal;
use crate::error::ApiError;

#[derive(Clone)]
pub struct Dir {
    root: PathBuf,
}

/// An upload being written to a temporary file.
pub struct Upload {
    temp: PathBuf,
    file: tokio::fs::File,
    target: PathBuf,
}

impl Upload {
    pub async fn write(&mut self, bytes: &[u8]) -> Result<(), ApiError> {
        self.file.write_all(bytes).await.map_err(internal)
    }

    /// Syncs the file and moves it into place.
    pub async fn commit(self) -> Result<(), ApiError> {
        self.file.sync_all().await.map_err(internal)?;
        tokio::fs::rename(&self.temp, &self.target)
            .await
            .map_err(internal)
    }

    pub async fn abort(self) {
        drop(self.file);
        let _ = tokio::fs::remove_file(&self.temp).await;
    }
}

impl Dir {
    pub fn open(root: &Path) -> Result<Self, String> {
        for sub in ["files", "parts", "tmp"] {
            std::fs::create_dir_all(root.join(sub))
                .map_err(|e| format!("{}: {e}", root.join(sub).display()))?;
        }
        sweep_stale(&root.join("tmp"));
        Ok(Self {
            root: root.to_path_buf(),
        })
    }

    /// Where a file's bytes live (`id` checked by the caller).
    fn file_path(&self, id: &str) -> PathBuf {
        self.root.join("files").join(id)
    }

    fn part_path(&self, key: &str) -> PathBuf {
        self.root.join("parts").join(key)
    }

    /// A fresh temporary path, renamed into place when written.
    fn temp_path(&self) -> PathBuf {
        self.root
            .join("tmp")
            .join(crate::batch::ids::new("upload-"))
    }

    pub async fn upload(&self, id: &str) -> Result<Upload, ApiError> {
        let temp = self.temp_path();
        let file = tokio::fs::File::create(&temp).await.map_err(internal)?;
        Ok(Upload {
            temp,
            file,
            target: self.file_path(id),
        })
    }

    /// The bytes of file `id`, as a response body streams them.
    pub async fn stream(&self, id: &str) -> Result<axum::body::Body, ApiError> {
        let file = tokio::fs::File::open(self.file_path(id))
            .await
            .map_err(internal)?;
        Ok(axum::body::Body::from_stream(
            tokio_util::io::ReaderStream::new(file),
        ))
    }

    /// Writes `bytes` as chunk blob `key`, durably.
    pub async fn put_part(&self, key: String, bytes: Vec<u8>) -> Result<(), ApiError> {
        let target = self.part_path(&key);
        let temp = self.temp_path();
        tokio::task::spawn_blocking(move || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&temp)?;
            f.write_all(&bytes)?;
            f.sync_all()?;
            std::fs::rename(&temp, &target)
        })
        .await
        .map_err(internal)?
        .map_err(internal)
    }

    /// Bytes `[start, end)` of file `id`.
    pub async fn read_range(&self, id: &str, start: u64, end: u64) -> Result<Vec<u8>, ApiError> {
        let path = self.file_path(id);
        tokio::task::spawn_blocking(move || -> std::io::Result<Vec<u8>> {
            let mut f = std::fs::File::open(path)?;
            f.seek(SeekFrom::Start(start))?;
            let mut buf = vec![0; (end - start) as usize];
            f.read_exact(&mut buf)?;
            Ok(buf)
        })
        .await
        .map_err(internal)?
        .map_err(internal)
    }

    pub async fn read_file(&self, id: &str) -> Result<Vec<u8>, ApiError> {
        tokio::fs::read(self.file_path(id)).await.map_err(internal)
    }

    /// Writes file `id` as the concatenation of chunk blobs `keys` (plus
    /// `tail`), durably; its size in bytes.
    pub async fn concat_parts(
        &self,
        id: &str,
        keys: Vec<String>,
        tail: Vec<u8>,
    ) -> Result<u64, ApiError> {
        let parts: Vec<PathBuf> = keys.iter().map(|k| self.part_path(k)).collect();
        let temp = self.temp_path();
        let target = self.file_path(id);
        tokio::task::spawn_blocking(move || -> std::io::Result<u64> {
            let mut out = std::io::BufWriter::new(std::fs::File::create(&temp)?);
            let mut n = 0;
            for p in parts {
                n += std::io::copy(&mut std::fs::File::open(p)?, &mut out)?;
            }
            out.write_all(&tail)?;
            n += tail.len() as u64;
            out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
            std::fs::rename(&temp, &target)?;
            Ok(n)
        })
        .await
        .map_err(internal)?
        .map_err(internal)
    }

    /// Deletes every chunk blob of `batch` (after its end is recorded;
    /// also those a holder wrote but never recorded).
    pub async fn delete_parts(&self, batch: &str) {
        let dir = self.root.join("parts");
        let prefix = format!("{batch}.");
        let _ = tokio::task::spawn_blocking(move || {
            if let Ok(entries) = std::fs::read_dir(&dir) {
                for e in entries.flatten() {
                    if e.file_name().to_string_lossy().starts_with(&prefix) {
                        let _ = std::fs::remove_file(e.path());
                    }
                }
            }
        })
        .await;
    }

    pub async fn delete_file(&self, id: &str) {
        let _ = tokio::fs::remove_file(self.file_path(id)).await;
    }
}

/// Removes what uploads and writes cut short by a crash left in `tmp/`:
/// entries untouched for a day (another Ivy sharing the directory may be
/// writing the fresh ones).
fn sweep_stale(tmp: &Path) {
    const DAY: std::time::Duration = std::time::Duration::from_secs(24 * 3600);
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for e in entries.flatten() {
        let stale = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > DAY);
        if stale {
            let _ = std::fs::remove_file(e.path());
        }
    }
}
