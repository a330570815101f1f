"""One source of truth for the tokenizer: Ivy started without --tokenizer
tokenizes with the file its replicas serve (sent in tulip.v1 Info), applies
the model's own prompts when no templates file is given, and refuses a
replica whose tokenizer differs from the others' (by the sha256 of the
file), with a log line and a metric. Real processes throughout."""

from __future__ import annotations

import json
import shutil

import numpy as np
from tokenizers import Tokenizer

from bench.harness.fixtures import corpus_lines
from tests.support.http import embed
from tests.support.servers import Ivy, Tulip, wait_for
from tests.support.vectors import cosines

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def _copy_model(src: str, dst, **st_config) -> str:
    shutil.copytree(src, dst)
    if st_config:
        path = dst / "config_sentence_transformers.json"
        cfg = json.loads(path.read_text())
        cfg.update(st_config)
        path.write_text(json.dumps(cfg))
    return str(dst)


def test_ivy_tokenizes_with_what_the_replica_serves(tulip_minilm, minilm_dir, st_minilm, log_dir):
    ivy = Ivy([tulip_minilm.url], False, log_dir=log_dir)
    try:
        texts = corpus_lines("botchan.txt")[500:520]
        assert cosines(embed(ivy, texts), st_minilm.encode(texts, normalize_embeddings=True)).min() >= 0.999
        hf = Tokenizer.from_file(f"{minilm_dir}/tokenizer.json")
        hf.no_padding()
        hf.no_truncation()
        status, body = ivy.post_json("/tokenize", {"inputs": texts[:5]})
        assert status == 200, body
        assert [[t["id"] for t in row] for row in body] == [e.ids for e in hf.encode_batch(texts[:5])]
        assert "tokenizer loaded from the replica" in ivy.log()
    finally:
        ivy.stop()


def test_the_models_own_prompts_are_the_default_templates(minilm_dir, log_dir, tmp_path):
    from sentence_transformers import SentenceTransformer

    prompted = _copy_model(minilm_dir, tmp_path / "prompted", prompts={"query": "query: ", "passage": "passage: "},
                           default_prompt_name="query")
    tulip = Tulip(prompted, log_dir=log_dir, model_id="sentence-transformers/all-MiniLM-L6-v2")
    try:
        ivy = Ivy([tulip.url], False, log_dir=log_dir)
        try:
            st = SentenceTransformer(prompted, device="cpu")
            texts = ["what is an embedding", "how do vectors capture meaning"]
            want = st.encode(texts, normalize_embeddings=True)  # applies the default prompt
            assert cosines(embed(ivy, texts), want).min() >= 0.999
            status, body = ivy.post_json("/v1/embeddings", {"input": texts, "prompt_name": "passage"})
            got = np.array([d["embedding"] for d in body["data"]], dtype=np.float32)
            want = st.encode(texts, prompt_name="passage", normalize_embeddings=True)
            assert cosines(got, want).min() >= 0.999
        finally:
            ivy.stop()
    finally:
        tulip.stop()


def test_a_replica_with_another_tokenizer_is_refused(tulip_minilm, minilm_dir, log_dir, tmp_path):
    other = _copy_model(minilm_dir, tmp_path / "other-tokenizer")
    tok = json.loads((tmp_path / "other-tokenizer" / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    a, b = "cat", "dog"  # same model, but two tokens swapped: different ids for the same text
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (tmp_path / "other-tokenizer" / "tokenizer.json").write_text(json.dumps(tok))
    second = Tulip(other, log_dir=log_dir, model_id="sentence-transformers/all-MiniLM-L6-v2")
    try:
        ivy = Ivy([tulip_minilm.url, second.url], False, log_dir=log_dir)
        try:
            # Whichever answers first defines the tokenizer; the other is refused.
            urls = [tulip_minilm.url, second.url]

            def state(name):
                m = ivy.metrics()
                return [m.get(f'{name}{{replica="{u}",model="{MINILM}"}}') for u in urls]

            wait_for(lambda: sorted(state("ivy_replica_mismatch")) == [0, 1], "one replica refused", timeout=30)
            refused = urls[state("ivy_replica_mismatch").index(1)]
            kept = urls[1 - urls.index(refused)]
            assert state("ivy_replica_up")[urls.index(kept)] == 1
            assert "another tokenizer" in ivy.log()
            # Every request goes to the replica whose tokenizer Ivy uses.
            for _ in range(4):
                embed(ivy, ["the cat sat on the mat"])
            assert ivy.series("ivy_replica_chunks_total", replica=refused) == 0
            assert ivy.series("ivy_replica_chunks_total", replica=kept) >= 4
        finally:
            ivy.stop()
    finally:
        second.stop()
