//! The pre-tokenizers' unit tests.

use super::*;

fn words(p: &PreTokenizer, text: &str) -> Vec<(String, u32)> {
    let mut src = NormBuf::default();
    src.set(text, 0);
    let (mut out, mut spare) = (Words::default(), Words::default());
    p.run(&src, 0..text.len(), &mut out, &mut spare);
    out.words
        .iter()
        .map(|w| (out.word(w).to_owned(), w.shift))
        .collect()
}

fn meta(prepend: PrependScheme, split: bool) -> Stage {
    Stage::Metaspace {
        replacement: '▁',
        prepend,
        split,
    }
}

/// The fused pass gives what the two stages give.
#[test]
fn fused_whitespace_metaspace_equals_the_stages() {
    for prepend in [
        PrependScheme::Always,
        PrependScheme::First,
        PrependScheme::Never,
    ] {
        for split in [true, false] {
            let fused = PreTokenizer::new(vec![Stage::WhitespaceSplit, meta(prepend, split)]);
            assert!(matches!(
                fused.stages[..],
                [Stage::WhitespaceMetaspace { .. }]
            ));
            let mut stages = PreTokenizer::new(vec![Stage::WhitespaceSplit]);
            stages.stages.push(meta(prepend, split));
            for text in [
                "",
                " ",
                "Hello  world",
                " lead",
                "a▁b ▁c▁▁",
                "x\u{3000}y\tz",
                "▁",
            ] {
                assert_eq!(
                    words(&fused, text),
                    words(&stages, text),
                    "{prepend:?} {split} {text:?}"
                );
            }
        }
    }
}

#[test]
fn whitespace_lead_bytes_cover_every_whitespace_char() {
    for c in (0x80..=0x10FFFFu32).filter_map(char::from_u32) {
        if chars::is_whitespace(c) {
            let mut buf = [0u8; 4];
            let lead = c.encode_utf8(&mut buf).as_bytes()[0];
            assert!(WHITESPACE_LEADS.contains(&lead), "{c:?}");
        }
    }
    assert!(!chars::is_whitespace(OTHER));
}

#[test]
fn bert_isolates_punctuation() {
    let p = PreTokenizer::new(vec![Stage::Bert]);
    let got: Vec<String> = words(&p, "Hi, there!! ok")
        .into_iter()
        .map(|w| w.0)
        .collect();
    assert_eq!(got, ["Hi", ",", "there", "!", "!", "ok"]);
}
