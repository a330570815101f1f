"""Prompt templates from the --config file: applied per request by
`prompt_name` (or the configured default), reloaded on SIGHUP and on file
change without a restart or a dropped request, and a broken file refused
with a log line while the running templates stay."""

from __future__ import annotations

import signal
import threading

import numpy as np
import pytest

from tests.support.servers import Ivy, wait_for

TEXT = "What is an embedding gateway?"
GOOD = 'default_prompt_name = "query"\n[prompts]\nquery = "query: "\ndocument = "passage: "\n'



def ids(ivy: Ivy, text: str, **extra) -> list[int]:
    status, body = ivy.post_json("/tokenize", {"inputs": text, **extra})
    assert status == 200, body
    return [t["id"] for t in body[0]]


@pytest.fixture()
def config(tmp_path):
    path = tmp_path / "templates.toml"
    path.write_text(GOOD)
    return path


@pytest.fixture()
def ivy_templated(tulip_minilm, minilm_dir, log_dir, config):
    proc = Ivy([tulip_minilm.url], minilm_dir, log_dir=log_dir, config=str(config))
    yield proc
    proc.stop()


def test_prompts_prefix_the_token_ids(ivy_templated, st_minilm):
    hf = st_minilm.tokenizer
    assert ids(ivy_templated, TEXT, prompt_name="query") == hf("query: " + TEXT)["input_ids"]
    assert ids(ivy_templated, TEXT, prompt_name="document") == hf("passage: " + TEXT)["input_ids"]
    # No prompt_name: the configured default.
    assert ids(ivy_templated, TEXT) == hf("query: " + TEXT)["input_ids"]


def test_prompted_embeddings_equal_prefixed_text(ivy_templated, ivy_minilm):
    status, with_prompt = ivy_templated.post_json("/embed", {"inputs": [TEXT], "prompt_name": "document"})
    assert status == 200
    status, plain = ivy_minilm.post_json("/embed", {"inputs": ["passage: " + TEXT]})
    assert status == 200
    assert np.allclose(with_prompt, plain, atol=1e-6)
    # The OpenAI route takes prompt_name too, and counts the prompt's tokens.
    status, q = ivy_templated.post_json("/v1/embeddings", {"input": TEXT, "prompt_name": "query"})
    status2, d = ivy_templated.post_json("/v1/embeddings", {"input": TEXT, "prompt_name": "document"})
    assert status == status2 == 200
    assert q["usage"]["prompt_tokens"] == len(ids(ivy_templated, TEXT, prompt_name="query"))
    assert not np.allclose(q["data"][0]["embedding"], d["data"][0]["embedding"], atol=1e-3)


def test_unknown_prompt_is_refused(ivy_templated):
    status, body = ivy_templated.post_json("/embed", {"inputs": TEXT, "prompt_name": "passage"})
    assert status == 422 and body["error_type"] == "Validation"
    assert "`passage` is unknown" in body["error"] and "`document`" in body["error"]
    status, body = ivy_templated.post_json("/v1/embeddings", {"input": TEXT, "prompt_name": "passage"})
    assert status == 422 and body["error"]["param"] == "prompt_name"


def test_sighup_reloads_without_restart_or_dropped_requests(ivy_templated, config, st_minilm):
    hf = st_minilm.tokenizer
    pid = ivy_templated.proc.pid
    statuses: list[int] = []
    stop = threading.Event()

    def traffic():
        while not stop.is_set():
            statuses.append(ivy_templated.post_json("/embed", {"inputs": [TEXT] * 4})[0])

    worker = threading.Thread(target=traffic)
    worker.start()
    try:
        config.write_text('[prompts]\nquery = "search_query: "\n')
        ivy_templated.signal(signal.SIGHUP)
        want = hf("search_query: " + TEXT)["input_ids"]
        wait_for(lambda: ids(ivy_templated, TEXT, prompt_name="query") == want, "the new template")
        # The old default is gone with the file that named it.
        assert ids(ivy_templated, TEXT) == hf(TEXT)["input_ids"]
    finally:
        stop.set()
        worker.join()
    assert statuses and set(statuses) == {200}
    assert ivy_templated.proc.pid == pid and ivy_templated.alive()
    assert "SIGHUP: reloading the config" in ivy_templated.log()


def test_file_change_alone_reloads(ivy_templated, config, st_minilm):
    config.write_text(GOOD.replace('"passage: "', '"doc: "'))
    want = st_minilm.tokenizer("doc: " + TEXT)["input_ids"]
    wait_for(lambda: ids(ivy_templated, TEXT, prompt_name="document") == want, "the changed file")


@pytest.mark.parametrize("broken", [
    "[prompts\nquery = 'q: '\n",
    'default_prompt_name = "missing"\n[prompts]\nquery = "q: "\n',
    '[prompts]\nquery = 3\n',
    'promts = {}\n',
])
def test_broken_config_is_refused_and_old_templates_stay(ivy_templated, config, st_minilm, broken):
    config.write_text(broken)
    ivy_templated.signal(signal.SIGHUP)
    wait_for(lambda: "config reload refused" in ivy_templated.log(), "the refusal log line")
    assert ivy_templated.metrics()['ivy_config_reloads_total{result="refused"}'] >= 1
    assert ids(ivy_templated, TEXT, prompt_name="document") == st_minilm.tokenizer("passage: " + TEXT)["input_ids"]
    assert ids(ivy_templated, TEXT) == st_minilm.tokenizer("query: " + TEXT)["input_ids"]


def test_broken_config_at_start_up_is_an_error(tulip_minilm, minilm_dir, log_dir, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('default_prompt_name = "nope"\n')
    with pytest.raises(RuntimeError) as e:
        Ivy([tulip_minilm.url], minilm_dir, log_dir=log_dir, config=str(bad))
    assert "invalid --config" in str(e.value) and "`nope`" in str(e.value)
