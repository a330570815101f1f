//! The rest of the interface against Hugging Face: the loader's choice of
//! backend, the fallback backend's truncation, vocabulary queries, char
//! offsets and batches.

mod common;

use common::{corpus_lines, tokenizer_path, Pair, IN_HOUSE};
use ivy_tokenizer::{char_offsets, Backend, Direction, EncodeOptions, Encoding, Tokenizer};

fn json(name: &str) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(tokenizer_path(name)).unwrap()).unwrap()
}

fn load(value: &serde_json::Value) -> ivy_tokenizer::Result<Tokenizer> {
    Tokenizer::from_bytes(&serde_json::to_vec(value).unwrap())
}

#[test]
fn byte_level_bpe_runs_on_hugging_face() {
    let tok = Tokenizer::from_file(tokenizer_path("qwen3")).unwrap();
    assert!(
        matches!(tok.backend(), Backend::HuggingFace(why) if why.contains("BPE")),
        "{}",
        tok.backend()
    );
}

#[test]
fn unknown_components_and_fields_fall_back_instead_of_differing() {
    type Edit = (&'static str, fn(&mut serde_json::Value));
    let edits: [Edit; 5] = [
        ("a normalizer not implemented here", |j| {
            j["normalizer"] =
                serde_json::json!({"type": "Strip", "strip_left": true, "strip_right": true});
        }),
        ("an unknown field", |j| {
            j["normalizer"]["future_option"] = serde_json::json!(true);
        }),
        ("an unknown model field", |j| {
            j["model"]["dropout"] = serde_json::json!(0.1);
        }),
        ("another post-processor", |j| {
            j["post_processor"] = serde_json::json!({"type": "RobertaProcessing", "sep": ["[SEP]", 102],
                "cls": ["[CLS]", 101], "trim_offsets": true, "add_prefix_space": false});
        }),
        ("another pre-tokenizer", |j| {
            j["pre_tokenizer"] = serde_json::json!({"type": "Whitespace"});
        }),
    ];
    for (what, edit) in edits {
        let mut j = json("all-minilm-l6-v2");
        edit(&mut j);
        let tok = load(&j).unwrap();
        assert!(
            matches!(tok.backend(), Backend::HuggingFace(_)),
            "{what}: {}",
            tok.backend()
        );
        // And it still tokenizes, exactly as Hugging Face does.
        let mut hf = tokenizers::Tokenizer::from_bytes(serde_json::to_vec(&j).unwrap()).unwrap();
        hf.with_padding(None).with_truncation(None).unwrap();
        let text = "Hello, world! Some   text.";
        let ours = tok.encode(text, &EncodeOptions::default()).unwrap();
        assert_eq!(ours.ids, hf.encode(text, true).unwrap().get_ids(), "{what}");
    }
}

#[test]
fn broken_files_are_errors() {
    assert!(Tokenizer::from_bytes(b"{not json").is_err());
    let mut j = json("spm-test-en");
    j["model"]["unk_id"] = serde_json::json!(5000);
    assert!(load(&j).is_err());
    let err = Tokenizer::from_file("/nonexistent/tokenizer.json")
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("/nonexistent/tokenizer.json"),
        "{err}"
    );
}

#[test]
fn vocabulary_queries_match_hugging_face() {
    for name in IN_HOUSE {
        let pair = Pair::load(name);
        let (ours, hf) = (&pair.ours, &pair.oracle);
        assert_eq!(ours.vocab_size(), hf.get_vocab_size(true), "{name}");
        for id in 0..ours.vocab_size() as u32 + 3 {
            assert_eq!(ours.id_to_token(id), hf.id_to_token(id), "{name} id {id}");
        }
        for pair_input in [false, true] {
            let want = hf.get_post_processor().map_or(0, |p| {
                use tokenizers::PostProcessor;
                p.added_tokens(pair_input)
            });
            assert_eq!(ours.num_special_tokens(pair_input), want, "{name}");
        }
        assert!(ours.vocab_memory_bytes().unwrap() > 0);
    }
}

/// The fallback backend reproduces Hugging Face's truncation too, pairs
/// included (where the tokenizer stops tokenizing early).
#[test]
fn fallback_backend_matches_hugging_face_truncation() {
    let path = tokenizer_path("qwen3");
    let ours = Tokenizer::from_file(&path).unwrap();
    let mut hf = tokenizers::Tokenizer::from_file(&path).unwrap();
    let lines: Vec<String> = corpus_lines().into_iter().step_by(7).collect();
    let mut out = Encoding::default();
    for max_length in [None, Some(6), Some(33)] {
        for direction in [Direction::Right, Direction::Left] {
            let opts = EncodeOptions {
                add_special_tokens: true,
                max_length,
                direction,
            };
            hf.with_truncation(max_length.map(|max_length| tokenizers::TruncationParams {
                max_length,
                direction: match direction {
                    Direction::Right => tokenizers::TruncationDirection::Right,
                    Direction::Left => tokenizers::TruncationDirection::Left,
                },
                ..Default::default()
            }))
            .unwrap();
            for (i, a) in lines.iter().enumerate() {
                let b = &lines[(i + 1) % lines.len()];
                ours.encode_pair_into(a, Some(b), &opts, &mut out).unwrap();
                let want = hf.encode((a.as_str(), b.as_str()), true).unwrap();
                assert_eq!(out.ids, want.get_ids(), "{opts:?} on {a:?} / {b:?}");
                ours.encode_into(a, &opts, &mut out).unwrap();
                assert_eq!(out.ids, hf.encode(a.as_str(), true).unwrap().get_ids());
            }
        }
    }
}

#[test]
fn char_offsets_match_hugging_face() {
    for name in ["xlm-roberta", "all-minilm-l6-v2", "qwen3"] {
        let path = tokenizer_path(name);
        let ours = Tokenizer::from_file(&path).unwrap();
        let mut hf = tokenizers::Tokenizer::from_file(&path).unwrap();
        hf.with_padding(None).with_truncation(None).unwrap();
        for line in corpus_lines().iter().step_by(5) {
            let enc = ours.encode(line, &EncodeOptions::default()).unwrap();
            let want: Vec<(u32, u32)> = hf
                .encode_char_offsets(line.as_str(), true)
                .unwrap()
                .get_offsets()
                .iter()
                .map(|&(s, e)| (s as u32, e as u32))
                .collect();
            assert_eq!(char_offsets(line, &enc.offsets), want, "{name} on {line:?}");
        }
    }
}

#[test]
fn batches_equal_single_calls_in_order() {
    let tok = Tokenizer::from_file(tokenizer_path("xlm-roberta")).unwrap();
    // Large enough in bytes to be spread over threads.
    let lines = corpus_lines();
    let opts = EncodeOptions {
        add_special_tokens: true,
        max_length: Some(64),
        direction: Direction::Left,
    };
    let batch = tok.encode_batch(&lines, &opts).unwrap();
    assert_eq!(batch.len(), lines.len());
    for (line, enc) in lines.iter().zip(&batch) {
        assert_eq!(enc, &tok.encode(line, &opts).unwrap());
    }
}

#[test]
fn untruncated_length_counts_every_token() {
    let tok = Tokenizer::from_file(tokenizer_path("all-minilm-l6-v2")).unwrap();
    let text = "word ".repeat(50);
    let full = tok.encode(&text, &EncodeOptions::default()).unwrap();
    assert_eq!(full.len(), 52);
    assert!(!full.truncated());
    let cut = tok
        .encode(
            &text,
            &EncodeOptions {
                max_length: Some(10),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((cut.len(), cut.untruncated_len), (10, 52));
    assert!(cut.truncated());
    assert_eq!(cut.special.iter().filter(|&&s| s).count(), 2);
}
