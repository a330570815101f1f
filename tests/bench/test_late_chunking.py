"""The late-chunking benchmark (``python -m bench late-chunking``): its
dataset holds together (every target chunk exists and holds its answer, no
target names its question's entity, another chunk of the document does),
its in-process reference pools what a late-chunking server pools, and its
quick mode runs against the shared Ivy and on the simulated device. No timing is asserted."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from bench.harness import inputs
from bench.harness import late_chunking_dataset as dataset
from bench.harness.late_chunking_reference import Reference
from bench.harness.results import Writer
from bench.sim import late_chunking as sim_late_chunking
from bench.sim.replicas import bge_m3_dir
from bench.suites import late_chunking


def test_every_question_has_its_target_and_its_entity_elsewhere():
    assert dataset.faults() == []
    data = dataset.load()
    assert len(data.questions) >= 40 and len(data.pool()) > 500
    assert all(len(d.chunks) <= 64 for d in data.documents)  # the shared Ivy takes 64 inputs a request


def test_a_target_naming_its_entity_or_missing_is_a_fault():
    spec = copy.deepcopy(dataset._spec())
    spec["questions"][0]["entity"] = "Kantaro"  # q01's target names him
    spec["questions"][1]["chunk"] = 99
    spec["questions"][2]["answer"] = "ten yen"
    spec["documents"][5]["lines"] = [608, 627]
    found = "\n".join(dataset.faults(spec))
    assert "q01: the target chunk names the entity 'Kantaro'" in found
    assert "q02: no chunk d02#99" in found
    assert "q03: the answer 'ten yen' is not in the target chunk" in found
    assert "d06: chunks changed" in found


def test_documents_reach_past_one_and_two_windows(minilm_dir):
    tokens = [inputs.count(minilm_dir, d.text) for d in dataset.load().documents]
    assert any(n <= 256 for n in tokens) and any(256 < n <= 512 for n in tokens) and any(n > 512 for n in tokens)


def test_chunks_are_sentences_that_join_back_into_the_document():
    text = ('"Rather dull? See if they don\'t cut!" I retorted. Mr. K. Natsume wrote it down for all of us. '
            "The bone of the thumb was hard enough.")
    assert dataset.chunk(text) == ['"Rather dull? See if they don\'t cut!" I retorted.',
                                   "Mr. K. Natsume wrote it down for all of us.",
                                   "The bone of the thumb was hard enough."]
    assert dataset.join(dataset.chunk(text)) == text
    assert dataset.join(["one", "two"]) == "one two"
    assert dataset.join(["one ", "two"]) == "one two" and dataset.join(["one", "\ntwo"]) == "one\ntwo"


def test_one_late_chunk_is_the_ordinary_embedding(minilm_dir, st_minilm):
    doc = next(d for d in dataset.load().documents if d.id == "d31")  # 222 tokens: one window
    ref = Reference(minilm_dir, 1, 256)
    whole, n = ref.late([doc.text], doc.text)
    assert n == inputs.count(minilm_dir, doc.text)
    want = st_minilm.encode([doc.text], normalize_embeddings=True)
    assert float(whole[0] @ want[0]) > 0.9999
    chunks = list(doc.chunks)
    late, alone = ref.late(chunks, doc.text)[0], ref.alone(chunks)
    assert np.allclose(np.linalg.norm(late, axis=1), 1, atol=1e-5)
    assert np.allclose(alone, st_minilm.encode(chunks, normalize_embeddings=True), atol=1e-4)
    assert float((late * alone).sum(1).max()) < 0.999  # each chunk saw its document


@pytest.mark.slow
def test_quick_run_against_ivy(ivy_minilm, minilm_dir):
    gates: list[dict] = []
    data, md = late_chunking.measure(ivy_minilm, minilm_dir, 1, gates, **late_chunking.quick_options())
    assert data["dataset"]["documents"] == 3 and data["dataset"]["questions"] == 5
    assert gates and all(g["passed"] for g in gates)
    assert data["cross_check"]["late_within_window_min_cosine"] >= 0.999
    for side in ("served alone", "served late", "reference alone", "reference late"):
        assert 0 <= data["retrieval"][side]["recall@1"] <= data["retrieval"][side]["recall@5"] <= 1, side
    speed = data["throughput"]["dataset"]
    assert speed["late"]["median_docs_per_s"] > 0 and speed["alone"]["median_chunks_per_s"] > 0
    assert "recall@5" in md and "sim --only late-chunking" in md


@pytest.mark.slow
def test_quick_run_on_the_simulated_device(tmp_path):
    path = sim_late_chunking.run(Writer(tmp_path, ["test"]), True, bge_m3_dir(tmp_path), tmp_path)
    record = json.loads(path.with_suffix(".json").read_text())
    assert record["gates"] and all(g["passed"] for g in record["gates"])
    speed = record["results"]["sets"]["dataset"]
    for mode in ("late", "alone"):
        assert speed[mode]["median_docs_per_s"] > 0 and speed[mode]["device_ms_per_document"] > 0, mode
