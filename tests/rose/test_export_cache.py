"""The CPU fast path's export cache (rose/cpu/cache.py) on real folders:
its key follows what determines an export, an entry appears whole or not
at all, what a killed start left is swept, the oldest entries go first to
stay within the bound, and a folder that cannot be written turns the fast
path off in one line instead of failing the engine."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess

from rose import Engine
from rose.cpu import OnnxSettings
from rose.cpu.cache import META, STAGING, ExportCache, export_key
from tests.support.steps import step

PLAN = {"max_tokens": 256, "max_sequences": 64}


def test_key_follows_the_weights_and_the_plan_not_the_bytecode(bert_dir, tmp_path):
    model = shutil.copytree(bert_dir, tmp_path / "bert")
    key, meta = export_key(model, PLAN)
    assert export_key(model, PLAN)[0] == key
    assert meta["max_tokens"] == "256" and meta["torch"] != "none" and meta["onnxruntime"] != "none"
    assert export_key(model, {**PLAN, "max_tokens": 128})[0] != key
    (model / "__pycache__").mkdir()
    (model / "__pycache__" / "x.pyc").write_bytes(b"compiled")
    assert export_key(model, PLAN)[0] == key
    weights = model / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one weight's last byte: the same size and header
    weights.write_bytes(bytes(data))
    assert export_key(model, PLAN)[0] != key


def test_an_entry_appears_whole_and_a_dead_start_s_staging_is_swept(tmp_path):
    cache = ExportCache(tmp_path / "cache")
    assert cache.problem() is None
    staging = cache.staging()
    (staging / "model.onnx").write_bytes(b"x" * 100)
    assert cache.lookup("k1") is None  # nothing is trusted before the commit
    (tmp_path / "cache" / "onnx-k2").mkdir()  # a folder without its meta.json
    (tmp_path / "cache" / "onnx-k2" / "model.onnx").write_bytes(b"half")
    assert cache.lookup("k2") is None
    other = cache.staging()
    (other / "model.onnx").write_bytes(b"whole")
    assert (cache.commit(other, "k2", {}) / "model.onnx").read_bytes() == b"whole"  # replaced, not kept
    entry = cache.commit(staging, "k1", {"why": "test"})
    assert cache.lookup("k1") == entry and (entry / META).is_file() and not staging.exists()

    dead = subprocess.Popen(["true"])  # a pid that no longer runs
    dead.wait()
    mine = cache.staging()
    host = mine.name[len(STAGING):].rsplit("-", 2)[0]
    orphan = tmp_path / "cache" / f"{STAGING}{host}-{dead.pid}-abcd1234"
    orphan.mkdir()
    assert cache.sweep() == [orphan]
    assert mine.is_dir()  # this process's own is kept


def _entry(cache: ExportCache, key: str, size: int, age: float):
    staging = cache.staging()
    (staging / "model.onnx").write_bytes(b"x" * size)
    entry = cache.commit(staging, key, {})
    os.utime(entry, (1e9 + age, 1e9 + age))
    return entry


def test_the_oldest_entries_go_first_to_stay_within_the_bound(tmp_path):
    cache = ExportCache(tmp_path / "cache", max_bytes=2500)
    old, mid, new = (_entry(cache, k, 1000, age) for k, age in (("old", 1), ("mid", 2), ("new", 3)))
    cache.lookup("old")  # used now: the newest
    assert cache.evict(keep=new) == [mid]
    assert sum(size for _, size, _ in cache.entries()) <= 2500
    assert ExportCache(tmp_path / "cache", max_bytes=0).evict(keep=new)[-1] == new  # 0 keeps none
    assert cache.entries() == [] and not old.exists()


def test_an_unwritable_cache_turns_the_fast_path_off_in_one_line(bert_dir, tmp_path, caplog):
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # a folder cannot be made beneath a file, even by root
    with caplog.at_level(logging.INFO, logger="rose.cpu"):
        e = Engine.from_dir(bert_dir, device="cpu", dtype="float32",
                            cpu_runtimes=[OnnxSettings(cache_dir=str(blocked / "cache"))])
    assert e.runner.runtime("onnx") is None
    lines = [r.getMessage() for r in caplog.records if "CPU fast path off" in r.getMessage()]
    assert len(lines) == 1 and f"the cache folder {blocked / 'cache'} is not writable" in lines[0], lines
    assert step(e, [[101, 2000, 2001, 102]])[0] == "eager"
