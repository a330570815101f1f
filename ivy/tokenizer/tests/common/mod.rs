//! Shared by the identity tests: the fixtures, the Hugging Face oracle and
//! the text generator.

#![allow(dead_code)]

pub mod gen;
// Also compiled into bench/crates/tokenizer (one copy of the unpacker).
mod unpack;
pub use unpack::unpacked;

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
