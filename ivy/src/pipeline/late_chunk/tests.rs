use proto::tulip::v1::EmbedResponse;

use super::super::chunk::Chunk;
use super::*;

fn tokenizer(name: &str) -> Tokenizer {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/data/tokenizers")
        .join(name);
    // The larger tokenizer.json files are tracked as .gz (read in memory here).
    let gz = dir.join("tokenizer.json.gz");
    if !dir.join("tokenizer.json").is_file() && gz.is_file() {
        let mut json = Vec::new();
        let file = std::fs::File::open(&gz).unwrap();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(file), &mut json).unwrap();
        return Tokenizer::from_bytes(&json).unwrap();
    }
    Tokenizer::from_file(dir).unwrap()
}

fn texts(chunks: &[&str]) -> Vec<String> {
    chunks.iter().map(|&c| c.to_owned()).collect()
}

/// Token states whose row for a token is (window, row, id) repeated.
fn states(plan: &Plan) -> Output {
    let mut data = Vec::new();
    let mut at = 0;
    for (w, &len) in plan.sent.lengths.iter().enumerate() {
        for r in 0..len as usize {
            let id = plan.sent.token_ids[at + r];
            for v in [w as f32, r as f32, id as f32] {
                data.extend_from_slice(&v.to_le_bytes());
            }
        }
        at += len as usize;
    }
    let reply = EmbedResponse {
        rows: plan.sent.token_ids.len() as u32,
        dim: 3,
        data: data.into(),
        row_counts: plan.sent.lengths.clone(),
        ..Default::default()
    };
    let chunk = Chunk {
        sequences: 0..plan.sent.lengths.len(),
        tokens: 0..plan.sent.token_ids.len(),
    };
    Output::merge(Kind::TokenStates, &[chunk], vec![reply]).unwrap()
}

#[test]
fn chunks_are_joined_by_one_space_unless_they_hold_their_own() {
    let (doc, ends) = join(&texts(&[
        "Berlin is big.",
        "Its people",
        " are many.\n",
        "End",
    ]));
    assert_eq!(doc, "Berlin is big. Its people are many.\nEnd");
    assert_eq!(ends, vec![14, 25, 36, 39]);
}

#[test]
fn specials_open_the_first_span_and_close_the_last() {
    let tok = tokenizer("all-minilm-l6-v2");
    let chunks = texts(&["Berlin is the capital.", "Its population is large."]);
    let plan = Plan::new(&tok, "", &chunks, 512, "input").unwrap();
    let enc = tok
        .encode(
            "Berlin is the capital. Its population is large.",
            &EncodeOptions::default(),
        )
        .unwrap();
    assert_eq!(plan.sent.token_ids, enc.ids);
    // [CLS] berlin is the capital . | its population is large . [SEP]
    assert_eq!(plan.spans, vec![0..6, 6..enc.ids.len()]);
}

#[test]
fn a_prompt_belongs_to_the_first_chunk_and_multibyte_text_maps_exactly() {
    let tok = tokenizer("xlm-roberta");
    let chunks = texts(&[
        "Zürich liegt am See.",
        "Dort wohnen 400 000 Menschen — viele.",
        "東京は大きい。",
    ]);
    let plan = Plan::new(&tok, "query: ", &chunks, 512, "input").unwrap();
    let enc = tok
        .encode(
            "query: Zürich liegt am See. Dort wohnen 400 000 Menschen — viele. 東京は大きい。",
            &EncodeOptions::default(),
        )
        .unwrap();
    assert_eq!(plan.sent.token_ids, enc.ids);
    assert_eq!(plan.spans[0].start, 0);
    assert_eq!(plan.spans[2].end, enc.ids.len());
    let text = |r: &Range<usize>| tok.decode(&enc.ids[r.clone()], true).unwrap();
    assert_eq!(text(&plan.spans[0]).trim(), "query: Zürich liegt am See.");
    assert_eq!(
        text(&plan.spans[1]).trim(),
        "Dort wohnen 400 000 Menschen — viele."
    );
    assert_eq!(text(&plan.spans[2]).trim(), "東京は大きい。");
}

#[test]
fn a_byte_level_token_carrying_the_space_goes_with_its_word() {
    let tok = tokenizer("qwen3");
    let chunks = texts(&["Berlin is big.", "Its people are many."]);
    let plan = Plan::new(&tok, "", &chunks, 512, "input").unwrap();
    let first: Vec<u32> = plan.sent.token_ids[plan.spans[1].clone()].to_vec();
    assert_eq!(tok.decode(&first, false).unwrap(), " Its people are many.");
}

#[test]
fn a_chunk_without_tokens_of_its_own_is_refused() {
    let tok = tokenizer("all-minilm-l6-v2");
    let err = Plan::new(&tok, "", &texts(&["Berlin.", "   ", "More."]), 512, "input").unwrap_err();
    assert!(
        err.to_string().contains("input[1] has no token of its own"),
        "{err}"
    );
}

#[test]
fn long_documents_take_each_state_from_the_window_with_most_context() {
    let tok = tokenizer("all-minilm-l6-v2");
    let chunks: Vec<String> = (0..30)
        .map(|i| format!("Sentence {i} talks about topic number {i} at some length."))
        .collect();
    let plan = Plan::new(&tok, "", &chunks, 64, "input").unwrap();
    let whole = Plan::new(&tok, "", &chunks, 100_000, "input").unwrap();
    let ids = &whole.sent.token_ids;
    assert!(plan.sent.lengths.len() > 3 && plan.sent.lengths.iter().all(|&l| l <= 64));
    assert_eq!(plan.spans, whole.spans);
    let out = states(&plan);
    let mut starts = vec![0];
    for &l in &plan.sent.lengths {
        starts.push(starts.last().unwrap() + l as usize);
    }
    for (p, &(w, r)) in plan.source.iter().enumerate() {
        // Every token is read where it sits, and (inside the body) at
        // least a quarter window's overlap / 2 from an edge when it could be.
        assert_eq!(plan.sent.token_ids[starts[w] + r], ids[p], "token {p}");
        let v: Vec<f32> = floats(&out.vectors(w)[r * 12..r * 12 + 12]).collect();
        assert_eq!(v, vec![w as f32, r as f32, ids[p] as f32]);
        let len = plan.sent.lengths[w] as usize;
        if p > 0 && p + 1 < ids.len() && w > 0 && w + 1 < plan.sent.lengths.len() {
            assert!(r.min(len - 1 - r) >= 62 / 8, "token {p}: row {r} of {len}");
        }
    }
    assert_eq!(plan.source[0], (0, 0));
    let last = plan.sent.lengths.len() - 1;
    assert_eq!(
        *plan.source.last().unwrap(),
        (last, plan.sent.lengths[last] as usize - 1)
    );
}

#[test]
fn spans_pool_as_the_model_does() {
    let tok = tokenizer("all-minilm-l6-v2");
    let plan = Plan::new(
        &tok,
        "",
        &texts(&["One two.", "Three four five."]),
        512,
        "input",
    )
    .unwrap();
    let out = states(&plan);
    let ids = &plan.sent.token_ids;
    let pooled = |p: Pooling| -> Vec<Vec<f32>> {
        let o = plan.pool(&out, p, None, false).unwrap();
        (0..o.sequences)
            .map(|i| floats(o.row(i)).collect())
            .collect()
    };
    let span = &plan.spans[1];
    let mean_id = span.clone().map(|p| ids[p] as f64).sum::<f64>() / span.len() as f64;
    let mean = pooled(Pooling::Mean);
    assert_eq!(mean.len(), 2);
    assert!((f64::from(mean[1][2]) - mean_id).abs() < 1e-3);
    assert_eq!(pooled(Pooling::Last)[1][2], ids[span.end - 1] as f32);
    let max = span.clone().map(|p| ids[p]).max().unwrap() as f32;
    assert_eq!(pooled(Pooling::Max)[1][2], max);
    let normalized = plan.pool(&out, Pooling::Mean, Some(2), true).unwrap();
    assert_eq!(normalized.dim, 2);
    let v: Vec<f32> = floats(normalized.row(0)).collect();
    assert!((v.iter().map(|x| x * x).sum::<f32>() - 1.0).abs() < 1e-5);
    assert_eq!(normalized.tokens, ids.len() as u64);
}
