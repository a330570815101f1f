"""The README's first steps as a newcomer follows them (issue 32, item 11):
the OpenAI Python example runs against a real Ivy and Tulip, the install
instructions work from a clone (no PyPI package is implied), the commands
that create .venv/ and target/dist/ivy are named, and nothing describes
the machine the authors tested on."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.support.servers import REPO

README = (REPO / "README.md").read_text(encoding="utf-8")
# The front page and the topic pages it links to (docs/), read as one.
DOCS = "\n".join([README, *(p.read_text(encoding="utf-8") for p in sorted((REPO / "docs").glob("*.md")))])


def test_the_openai_python_example_runs(ivy_minilm):
    pytest.importorskip("openai")
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    [example] = [b for b in blocks if "from openai import OpenAI" in b]
    code = example.replace("http://127.0.0.1:8080/v1", ivy_minilm.url + "/v1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "384", r.stdout


def test_the_grpc_python_example_runs(ivy_minilm):
    pytest.importorskip("grpc_tools")
    blocks = re.findall(r"```python\n(.*?)```", README, re.S)
    [example] = [b for b in blocks if "import grpc\n" in b]
    code = example.replace("127.0.0.1:8081", ivy_minilm.grpc_target)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "(1, 384)", r.stdout


def test_the_quick_start_comes_first_and_covers_the_first_hour():
    """Install, serve by default and by Hub id, then curl, the openai client
    and grpcio, before any other section (issue 30)."""
    sections = re.split(r"^## ", README, flags=re.M)
    assert sections[1].startswith("Quick start\n")
    quick = sections[1]
    for step in ["make install", ".venv/bin/tulip-rose serve    #", ".venv/bin/tulip-rose serve --model BAAI/",
                 "curl -s http://127.0.0.1:8080/v1/embeddings", "from openai import OpenAI", "import grpc\n"]:
        assert step in quick, step


def test_install_steps_are_from_a_clone():
    assert "pip install 'tulip-rose[" not in DOCS
    assert "pip install -e '.[cli]'" in DOCS and "no PyPI package yet" in DOCS


def test_the_commands_that_build_are_named():
    text = " ".join(README.split())
    assert "creates `.venv/`" in text and "`make install`" in text, "which command creates .venv/?"
    assert "`target/dist/ivy` (`make ivy`, i.e. `cargo build --profile dist -p ivy`)" in text


def test_no_remarks_about_the_authors_machine():
    assert "no network here" not in DOCS
