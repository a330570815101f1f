//! Property test: on 100,000 generated hostile strings per tokenizer, the
//! in-house pipeline and Hugging Face `tokenizers` agree exactly (ids,
//! offsets, special flags), including with truncation and pairs. The
//! generator is seeded, so a failure reproduces.

mod common;

use common::gen::{text, Rng};
use common::{Pair, IN_HOUSE};
use ivy_tokenizer::{Direction, EncodeOptions, Encoding};

const CASES: usize = 100_000;

fn run(index: usize) {
    let name = IN_HOUSE[index];
    let mut pair = Pair::load(name);
    let mut rng = Rng::new(0x1D2C_3B4A_0000 + index as u64);
    let mut out = Encoding::default();
    let mut failures = Vec::new();
    let mut configured = None;
    for case in 0..CASES {
        let a = text(&mut rng);
        let kind = rng.below(10);
        let mut opts = EncodeOptions {
            add_special_tokens: kind != 1,
            max_length: None,
            direction: Direction::Right,
        };
        if (2..=5).contains(&kind) || kind == 9 {
            opts.max_length = Some(4 + rng.below(40));
            opts.direction = if rng.chance(50) {
                Direction::Left
            } else {
                Direction::Right
            };
        }
        let b = (kind >= 8).then(|| text(&mut rng));
        if configured != Some(opts) {
            pair.configure(&opts);
            configured = Some(opts);
        }
        if let Err(e) = pair.check(&a, b.as_deref(), &opts, &mut out) {
            failures.push(format!("case {case}: {e}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{name}: {} of {CASES} generated strings differ; first ones:\n{}",
        failures.len(),
        failures
            .iter()
            .take(5)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn xlm_roberta_agrees_on_generated_text() {
    run(0);
}

#[test]
fn mon_unigram_agrees_on_generated_text() {
    run(1);
}

#[test]
fn spm_test_en_agrees_on_generated_text() {
    run(2);
}

#[test]
fn spm_test_ja_agrees_on_generated_text() {
    run(3);
}

#[test]
fn all_minilm_agrees_on_generated_text() {
    run(4);
}
