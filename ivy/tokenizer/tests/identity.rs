//! Identity with Hugging Face `tokenizers` on every corpus line, for every
//! tokenizer the in-house pipeline handles: ids, offsets and special-token
//! flags, with and without special tokens, truncated from either side, and
//! as pairs.

mod common;

use common::{corpus_lines, Pair, IN_HOUSE};
use ivy_tokenizer::{Direction, EncodeOptions, Encoding};

fn options() -> Vec<EncodeOptions> {
    let mut all = vec![
        EncodeOptions {
            add_special_tokens: true,
            max_length: None,
            direction: Direction::Right,
        },
        EncodeOptions {
            add_special_tokens: false,
            max_length: None,
            direction: Direction::Right,
        },
    ];
    for max_length in [5, 16, 64] {
        for direction in [Direction::Right, Direction::Left] {
            for add_special_tokens in [true, false] {
                all.push(EncodeOptions {
                    add_special_tokens,
                    max_length: Some(max_length),
                    direction,
                });
            }
        }
    }
    all
}

fn run(name: &'static str) {
    let mut pair = Pair::load(name);
    let lines = corpus_lines();
    let mut out = Encoding::default();
    let mut failures = Vec::new();
    let mut checked = 0usize;
    for opts in options() {
        pair.configure(&opts);
        for (i, line) in lines.iter().enumerate() {
            checked += 1;
            if let Err(e) = pair.check(line, None, &opts, &mut out) {
                failures.push(e);
            }
            // Pairs: each line with the next (cross-encoder shape).
            if i % 3 == 0 {
                let next = &lines[(i + 1) % lines.len()];
                checked += 1;
                if let Err(e) = pair.check(line, Some(next), &opts, &mut out) {
                    failures.push(e);
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} of {checked} encodings differ; first ones:\n{}",
        failures.len(),
        failures
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    eprintln!(
        "{name}: {checked} encodings identical ({} lines)",
        lines.len()
    );
}

#[test]
fn xlm_roberta_matches_hugging_face() {
    run(IN_HOUSE[0]);
}

#[test]
fn mon_unigram_matches_hugging_face() {
    run(IN_HOUSE[1]);
}

#[test]
fn spm_test_en_matches_hugging_face() {
    run(IN_HOUSE[2]);
}

#[test]
fn spm_test_ja_matches_hugging_face() {
    run(IN_HOUSE[3]);
}

#[test]
fn all_minilm_matches_hugging_face() {
    run(IN_HOUSE[4]);
}
