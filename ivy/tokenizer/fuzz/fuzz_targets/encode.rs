//! Fuzz target: any input, any options, in-house vs Hugging Face.
//!
//! The first two bytes choose the tokenizer and the options (special
//! tokens, truncation length and side, single text or pair); the rest is
//! the text (lossily decoded), split at the first `\x01\x02` into a pair.
//! Any difference in ids, offsets or special flags aborts.
//!
//! RUSTC_BOOTSTRAP=1 cargo fuzz run --sanitizer none encode (from ivy/tokenizer)

#![no_main]

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use ivy_tokenizer::{Direction, EncodeOptions, Encoding, Tokenizer};
use libfuzzer_sys::fuzz_target;
use tokenizers::utils::truncation::{TruncationDirection, TruncationParams, TruncationStrategy};

const NAMES: [&str; 5] = [
    "xlm-roberta",
    "mon-unigram",
    "spm-test-en",
    "spm-test-ja",
    "all-minilm-l6-v2",
];

struct Fixture {
    ours: Tokenizer,
    oracle: Mutex<tokenizers::Tokenizer>,
}

fn fixtures() -> &'static [Fixture] {
    static ALL: OnceLock<Vec<Fixture>> = OnceLock::new();
    ALL.get_or_init(|| {
        // Large fixtures are tracked as .gz: `python -m bench.harness.fixtures`
        // (from the repository root) unpacks them first.
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../tests/data/tokenizers");
        NAMES
            .iter()
            .map(|name| {
                let path = dir.join(name).join("tokenizer.json");
                let ours = Tokenizer::from_file(&path)
                    .expect("load (run `python -m bench.harness.fixtures` to unpack the .gz fixtures)");
                assert!(matches!(ours.backend(), ivy_tokenizer::Backend::InHouse(_)));
                let mut oracle = tokenizers::Tokenizer::from_file(&path).expect("oracle");
                oracle.with_padding(None);
                Fixture {
                    ours,
                    oracle: Mutex::new(oracle),
                }
            })
            .collect()
    })
}

fuzz_target!(|data: &[u8]| {
    let [pick, flags, rest @ ..] = data else {
        return;
    };
    let fixture = &fixtures()[*pick as usize % NAMES.len()];
    let text = String::from_utf8_lossy(rest);
    let (a, b) = match text.find("\u{1}\u{2}") {
        Some(i) if flags & 1 == 1 => (&text[..i], Some(&text[i + 2..])),
        _ => (&text[..], None),
    };
    let opts = EncodeOptions {
        add_special_tokens: flags & 2 == 0,
        max_length: (flags & 4 != 0).then_some(4 + (flags >> 4) as usize * 3),
        direction: if flags & 8 != 0 {
            Direction::Left
        } else {
            Direction::Right
        },
    };
    let mut ours = Encoding::default();
    fixture
        .ours
        .encode_pair_into(a, b, &opts, &mut ours)
        .expect("our encode");

    let mut oracle = fixture.oracle.lock().unwrap();
    let params = opts.max_length.map(|max_length| TruncationParams {
        max_length,
        strategy: TruncationStrategy::LongestFirst,
        stride: 0,
        direction: match opts.direction {
            Direction::Right => TruncationDirection::Right,
            Direction::Left => TruncationDirection::Left,
        },
    });
    oracle.with_truncation(params).unwrap();
    let want = match b {
        None => oracle.encode(a, opts.add_special_tokens),
        Some(b) => oracle.encode((a, b), opts.add_special_tokens),
    }
    .expect("oracle encode");
    let offsets: Vec<(u32, u32)> = want
        .get_offsets()
        .iter()
        .map(|&(s, e)| (s as u32, e as u32))
        .collect();
    let special: Vec<bool> = want
        .get_special_tokens_mask()
        .iter()
        .map(|&m| m != 0)
        .collect();
    assert_eq!(
        ours.ids,
        want.get_ids(),
        "ids differ on {a:?} / {b:?} with {opts:?}"
    );
    assert_eq!(
        ours.offsets, offsets,
        "offsets differ on {a:?} / {b:?} with {opts:?}"
    );
    assert_eq!(
        ours.special, special,
        "special flags differ on {a:?} / {b:?}"
    );
});
