//! Shared by the identity tests: the fixtures, the Hugging Face oracle and
//! the text generator.

#![allow(dead_code)]

pub mod gen;

use std::path::PathBuf;

use ivy_tokenizer::{Direction, EncodeOptions, Encoding, Tokenizer};
use tokenizers::utils::truncation::{TruncationDirection, TruncationParams, TruncationStrategy};

/// The tokenizers the in-house pipeline must reproduce exactly.
pub const IN_HOUSE: [&str; 5] = [
    "xlm-roberta",
    "mon-unigram",
    "spm-test-en",
    "spm-test-ja",
    "all-minilm-l6-v2",
];

pub fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/data")
}

pub fn tokenizer_path(name: &str) -> PathBuf {
    unpacked(
        data_dir()
            .join("tokenizers")
            .join(name)
            .join("tokenizer.json"),
    )
}

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

/// Every line of every corpus file (split on `\n`, so `\r` and the BOM stay).
pub fn corpus_lines() -> Vec<String> {
    let mut dir: Vec<_> = std::fs::read_dir(data_dir().join("corpus"))
        .expect("corpus dir")
        .map(|e| e.unwrap().path())
        .collect();
    dir.sort();
    let mut lines = Vec::new();
    for path in dir {
        let text = std::fs::read_to_string(&path).expect("corpus file");
        lines.extend(text.split('\n').map(str::to_owned));
    }
    lines
}

/// The in-house tokenizer and the oracle for one fixture.
pub struct Pair {
    pub name: &'static str,
    pub ours: Tokenizer,
    pub oracle: tokenizers::Tokenizer,
}

impl Pair {
    pub fn load(name: &'static str) -> Self {
        let path = tokenizer_path(name);
        let ours = Tokenizer::from_file(&path).expect("load ours");
        assert!(
            matches!(ours.backend(), ivy_tokenizer::Backend::InHouse(_)),
            "{name} is not handled in-house: {}",
            ours.backend()
        );
        let mut oracle = tokenizers::Tokenizer::from_file(&path).expect("load oracle");
        oracle.with_truncation(None).unwrap();
        oracle.with_padding(None);
        Self { name, ours, oracle }
    }

    /// Sets the oracle's truncation to match `opts`.
    pub fn configure(&mut self, opts: &EncodeOptions) {
        let params = opts.max_length.map(|max_length| TruncationParams {
            max_length,
            strategy: TruncationStrategy::LongestFirst,
            stride: 0,
            direction: match opts.direction {
                Direction::Right => TruncationDirection::Right,
                Direction::Left => TruncationDirection::Left,
            },
        });
        self.oracle.with_truncation(params).unwrap();
    }

    /// The oracle's answer, in our shape.
    pub fn expected(&self, a: &str, b: Option<&str>, opts: &EncodeOptions) -> Encoding {
        let enc = match b {
            None => self.oracle.encode(a, opts.add_special_tokens),
            Some(b) => self.oracle.encode((a, b), opts.add_special_tokens),
        }
        .expect("oracle encode");
        Encoding {
            ids: enc.get_ids().to_vec(),
            offsets: enc
                .get_offsets()
                .iter()
                .map(|&(s, e)| (s as u32, e as u32))
                .collect(),
            special: enc
                .get_special_tokens_mask()
                .iter()
                .map(|&m| m != 0)
                .collect(),
            untruncated_len: 0,
        }
    }

    /// Compares ids, offsets and special flags with the oracle; describes
    /// the first difference.
    pub fn check(
        &self,
        a: &str,
        b: Option<&str>,
        opts: &EncodeOptions,
        out: &mut Encoding,
    ) -> Result<(), String> {
        self.ours
            .encode_pair_into(a, b, opts, out)
            .map_err(|e| format!("{}: our encode failed on {a:?}: {e}", self.name))?;
        let want = self.expected(a, b, opts);
        if out.ids != want.ids || out.offsets != want.offsets || out.special != want.special {
            return Err(format!(
                "{}: {opts:?} on {a:?} / {b:?}\n ours   {:?}\n        {:?}\n oracle {:?}\n        {:?}",
                self.name, out.ids, out.offsets, want.ids, want.offsets
            ));
        }
        Ok(())
    }
}
