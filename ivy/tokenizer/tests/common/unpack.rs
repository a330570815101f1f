//! Large fixtures are tracked gzip-compressed; this unpacks them on first
//! use. Shared by the ivy-tokenizer tests and bench/crates/tokenizer (which
//! includes this file by path).

use std::path::PathBuf;

/// `path`, unpacked first from `path.gz` when only that exists: large
/// fixtures are tracked compressed (the tree travels to machines with a size
/// limit) and unpacked next to the `.gz`, git-ignored. A temporary file and
/// a rename keep concurrent test binaries from reading a half-written file.
pub fn unpacked(path: PathBuf) -> PathBuf {
    let mut gz = path.clone().into_os_string();
    gz.push(".gz");
    let gz = PathBuf::from(gz);
    if path.is_file() || !gz.is_file() {
        return path;
    }
    // Unique per process and per call: test threads may race here.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp-{}-{call}", std::process::id()));
    let src = std::fs::File::open(&gz).unwrap_or_else(|e| panic!("{}: {e}", gz.display()));
    let mut dst = std::fs::File::create(&tmp).unwrap_or_else(|e| panic!("{}: {e}", tmp.display()));
    std::io::copy(&mut flate2::read::GzDecoder::new(src), &mut dst)
        .unwrap_or_else(|e| panic!("unpacking {}: {e}", gz.display()));
    std::fs::rename(&tmp, &path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    path
}
