//! Benchmark inputs built from real text in `tests/data/corpus/`, shared by
//! the table-writing binary and the criterion bench.

use std::path::{Path, PathBuf};

use ivy_tokenizer::{EncodeOptions, Tokenizer};

// The same fixture unpacker as the ivy-tokenizer tests (one copy).
#[path = "../../../../ivy/tokenizer/tests/common/unpack.rs"]
mod unpack;
pub use unpack::unpacked;

/// Repository root (this crate sits in `bench/crates/tokenizer`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..")
}

pub fn tokenizer_path(name: &str) -> PathBuf {
    unpacked(
        repo_root()
            .join("tests/data/tokenizers")
            .join(name)
            .join("tokenizer.json"),
    )
}

fn corpus(file: &str) -> Vec<String> {
    let path = repo_root().join("tests/data/corpus").join(file);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| l.trim_start_matches('\u{feff}').trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect()
}

/// Multilingual Wikipedia passages (17 languages) without the synthetic
/// letter-bigram lines.
pub fn multilingual() -> Vec<String> {
    let mut lines = corpus("calibration_miracl.txt");
    lines.drain(320..340);
    lines
}

/// English prose (Botchan).
pub fn english() -> Vec<String> {
    corpus("botchan.txt").into_iter().skip(30).collect()
}

fn count(tok: &Tokenizer, text: &str) -> usize {
    tok.encode(text, &EncodeOptions::default())
        .expect("encode")
        .len()
}

/// Places where a window may end: after each whitespace run, or after every
/// char in text written without spaces (Japanese, Chinese, Thai).
fn cut_points(text: &str) -> Vec<usize> {
    let spaced = text.split_whitespace().count() * 12 > text.chars().count();
    let mut cuts: Vec<usize> = text
        .char_indices()
        .filter(|&(_, c)| !spaced || c.is_whitespace())
        .map(|(i, _)| i)
        .filter(|&i| i > 0)
        .collect();
    cuts.push(text.len());
    cuts
}

/// The longest prefix of `text` (ending at a cut point) with at most `max`
/// tokens, special tokens included, if it has at least `min`.
fn window(tok: &Tokenizer, text: &str, min: usize, max: usize) -> Option<String> {
    let cuts = cut_points(text);
    // Binary search on the cut points (token counts grow with length).
    let (mut lo, mut hi) = (0usize, cuts.len());
    while lo < hi {
        let mid = (lo + hi) / 2;
        if count(tok, text[..cuts[mid]].trim()) <= max {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    let best = text[..cuts[lo.checked_sub(1)?]].trim();
    let n = count(tok, best);
    (n >= min && n <= max).then(|| best.to_owned())
}

/// Short queries of 10–30 tokens: one window per line, its target length
/// cycling through the range, starting a third of the way in.
pub fn queries(tok: &Tokenizer, lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .enumerate()
        .filter_map(|(i, line)| {
            let target = 10 + (i * 7) % 21;
            let from = cut_points(line)
                .into_iter()
                .find(|&c| c >= line.len() / 3)
                .unwrap_or(0);
            window(tok, line[from..].trim(), 10, target.max(10))
                .or_else(|| window(tok, line, 10, 30))
        })
        .collect()
}

/// Documents of about 512 tokens (500–512, special tokens included):
/// consecutive lines joined, one window per starting line.
pub fn documents(tok: &Tokenizer, lines: &[String], n: usize) -> Vec<String> {
    let step = (lines.len() / n).max(1);
    (0..lines.len())
        .step_by(step)
        .filter_map(|start| {
            let mut text = String::new();
            for line in lines[start..].iter().chain(lines.iter()) {
                if !text.is_empty() {
                    text.push(' ');
                }
                text.push_str(line);
                if count(tok, &text) > 600 {
                    break;
                }
            }
            window(tok, &text, 500, 512)
        })
        .take(n)
        .collect()
}
