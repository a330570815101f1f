//! Criterion micro-benchmarks: in-house vs Hugging Face on the same inputs.
//!
//! cargo bench -p ivy-tokenizer-bench --features criterion

use criterion::{criterion_group, criterion_main, Criterion};
use ivy_tokenizer::{EncodeOptions, Encoding, Tokenizer};
use ivy_tokenizer_bench::{documents, english, multilingual, queries, tokenizer_path};

fn pair(name: &str) -> (Tokenizer, tokenizers::Tokenizer) {
    let path = tokenizer_path(name);
    let mut hf = tokenizers::Tokenizer::from_file(&path).unwrap();
    hf.with_truncation(None).unwrap();
    hf.with_padding(None);
    (Tokenizer::from_file(&path).unwrap(), hf)
}

fn group(
    c: &mut Criterion,
    name: &str,
    ours: &Tokenizer,
    hf: &tokenizers::Tokenizer,
    inputs: &[String],
) {
    let opts = EncodeOptions::default();
    let mut g = c.benchmark_group(name);
    let mut enc = Encoding::default();
    g.bench_function("in-house", |b| {
        b.iter(|| {
            for t in inputs {
                ours.encode_into(t, &opts, &mut enc).unwrap();
            }
        })
    });
    g.bench_function("hf", |b| {
        b.iter(|| {
            for t in inputs {
                hf.encode(t.as_str(), true).unwrap();
            }
        })
    });
    g.finish();
}

fn benches(c: &mut Criterion) {
    let (xlmr, xlmr_hf) = pair("xlm-roberta");
    let (bert, bert_hf) = pair("all-minilm-l6-v2");
    let ml = multilingual();
    let en = english();
    group(c, "xlmr_queries", &xlmr, &xlmr_hf, &queries(&xlmr, &ml));
    group(
        c,
        "xlmr_documents",
        &xlmr,
        &xlmr_hf,
        &documents(&xlmr, &ml, 16),
    );
    group(
        c,
        "wordpiece_queries",
        &bert,
        &bert_hf,
        &queries(&bert, &en),
    );
    group(
        c,
        "wordpiece_documents",
        &bert,
        &bert_hf,
        &documents(&bert, &en, 16),
    );
}

criterion_group!(tokenizer, benches);
criterion_main!(tokenizer);
