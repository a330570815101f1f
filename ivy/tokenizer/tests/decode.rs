//! `decode` is Hugging Face's: the same text for every corpus line's ids,
//! with and without special tokens, for every fixture (in-house and
//! Hugging Face backends), and for ids a client made up (out of the
//! vocabulary, special tokens in the middle).

mod common;

use common::{corpus_lines, tokenizer_path, IN_HOUSE};
use ivy_tokenizer::{Backend, EncodeOptions, Tokenizer};

fn check(name: &str, in_house: bool) {
    let path = tokenizer_path(name);
    let ours = Tokenizer::from_file(&path).expect("load ours");
    // Reading the decoder must not push a file off the in-house pipeline.
    assert_eq!(
        matches!(ours.backend(), Backend::InHouse(_)),
        in_house,
        "{name}"
    );
    let oracle = tokenizers::Tokenizer::from_file(&path).expect("load oracle");
    let vocab = ours.vocab_size() as u32;
    let mut checked = 0;
    for line in corpus_lines().iter().step_by(7).take(400) {
        let ids = ours
            .encode(line, &EncodeOptions::default())
            .expect("encode")
            .ids;
        // Made-up ids too: a special token in the middle, one past the
        // vocabulary, the last id.
        let mut odd = ids.clone();
        odd.insert(odd.len() / 2, ids[0]);
        odd.extend([vocab, vocab + 1000, vocab - 1]);
        for ids in [&ids, &odd] {
            for skip in [true, false] {
                let want = oracle.decode(ids, skip).expect("oracle decode");
                let got = ours.decode(ids, skip).expect("decode");
                assert_eq!(got, want, "{name}: {line:?} ids {ids:?} skip {skip}");
                checked += 1;
            }
        }
    }
    assert!(checked > 100, "{name}: only {checked} cases");
    assert_eq!(
        ours.decode(&[], true).unwrap(),
        oracle.decode(&[], true).unwrap()
    );
}

#[test]
fn decode_matches_hugging_face_in_house() {
    for name in IN_HOUSE {
        check(name, true);
    }
}

#[test]
fn decode_matches_hugging_face_on_its_backend() {
    check("qwen3", false);
}
