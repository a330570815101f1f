"""Figures that point to their data: every number with a unit quoted in
``bench/TARGETS.md`` and the results READMEs (``bench/results/**/README.md``)
can be found in a committed data file of the folder it speaks for.

The rule (bench/README.md, "Figures and their data"):
- checked: a number followed by a unit (ms, µs, s, ×, emb/s, embeddings/s,
  docs/s, documents/s, MiB, MB, GiB, GB, %), and both ends of a range
  (``0.94–1.06×``), outside code spans and blocks;
- not checked: a target or a bound (preceded by ≤, ≥, <, >) and an
  approximation (preceded by ≈ or ~);
- found: equal, at the precision printed, to a number in a JSON or CSV file
  of the README's folder (subfolders included) or of a results folder the
  file names (``../2026-12-04-cpu-2core/``, ``bench/results/...``; for
  TARGETS.md, the folders of each date it names); a percentage may be a
  fraction times 100, a ``*_kib`` CSV column may be read in MiB; lists of
  more than 50 bare numbers (raw samples) are left out, so that a figure
  does not pass by landing on one of thousands of latencies;
- or derived: the ratio, difference or percentage change of two other
  numbers on the same line ("92.3 against 34.2 (2.7×)", "missed by 33%").
A figure equal by chance to another number of those files passes: this
catches figures of runs that were never committed (or were overwritten),
it does not prove where each figure came from."""

from __future__ import annotations

import csv
import json
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"
TARGETS = REPO / "bench" / "TARGETS.md"

UNITS = r"(?:ms|µs|s|×|emb/s|embeddings/s|docs/s|documents/s|MiB|MB|GiB|GB|%)"
NUMBER = r"\d[\d,]*(?:\.\d+)?"
FIGURE = re.compile(rf"(?<![\w.\-/])([≤≥<>≈~]\s?)?({NUMBER})(?:\s?[–-]\s?({NUMBER}))?\s?({UNITS})(?![\w/])")
ANY_NUMBER = re.compile(rf"(?<![\w.]){NUMBER}")
RAW_SAMPLES = 50


def _numbers(value, out: list[float]) -> None:
    if isinstance(value, bool):
        return
    if isinstance(value, (int, float)):
        out.append(float(value))
    elif isinstance(value, dict):
        for v in value.values():
            _numbers(v, out)
    elif isinstance(value, list):
        if len(value) > RAW_SAMPLES and all(isinstance(v, (int, float)) for v in value):
            return
        for v in value:
            _numbers(v, out)


_DATA: dict[Path, list[float]] = {}


def data(folder: Path) -> list[float]:
    """Every number of the folder's JSON and CSV files (CSV ``*_kib``
    columns also in MiB)."""
    if folder not in _DATA:
        out: list[float] = []
        for path in sorted(folder.rglob("*.json")):
            _numbers(json.loads(path.read_text(encoding="utf-8")), out)
        for path in sorted(folder.rglob("*.csv")):
            with path.open(newline="", encoding="utf-8") as f:
                for row in csv.DictReader(f):
                    for column, cell in row.items():
                        try:
                            x = float(cell)
                        except (TypeError, ValueError):
                            continue
                        out += [x, x / 1024] if column.endswith("_kib") else [x]
        _DATA[folder] = out
    return _DATA[folder]


def _value(text: str) -> float:
    return float(text.replace(",", ""))


def _half_digit(text: str) -> float:
    decimals = len(text.split(".")[1]) if "." in text else 0
    return 0.5 * 10 ** -decimals + 1e-9


def _found(text: str, unit: str, values: list[float]) -> bool:
    x, e = _value(text), _half_digit(text)
    scales = (1, 100) if unit == "%" else (1,)
    return any(abs(abs(v) * s - x) <= e for v in values for s in scales)


def _derived(text: str, line: str, start: int) -> bool:
    x, e = _value(text), _half_digit(text)
    others = [_value(m.group()) for m in ANY_NUMBER.finditer(line) if m.start() != start]
    for a in others:
        for b in others:
            if b == 0 or a == b:
                continue
            # a / 1 would be any other number of the line: not a derivation.
            ways = ((a / b,) if b != 1 else ()) + ((a / b - 1) * 100, a - b)
            if any(abs(abs(c) - x) <= e for c in ways):
                return True
    return False


def _without_code(text: str) -> str:
    """Code blocks and spans blanked out, line numbers kept."""
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group().count("\n"), text, flags=re.S)
    return re.sub(r"`[^`\n]*`", "``", text)


def named_folders(text: str, by_date: bool) -> list[Path]:
    """Results folders a file names by path (and, ``by_date``, by date)."""
    out = [RESULTS / m.group(1) for m in re.finditer(r"(?:\.\./|bench/results/)(20\d\d-\d\d-\d\d[\w-]*)", text)]
    if by_date:
        for m in re.finditer(r"\b(20\d\d-\d\d-\d\d)\b", text):
            out += RESULTS.glob(m.group(1) + "*")
    return sorted({f for f in out if f.is_dir()})


def untraced(md: Path, own: list[Path], by_date: bool = False) -> list[str]:
    """``path:line figure`` of each figure of ``md`` the rule refuses."""
    raw = md.read_text(encoding="utf-8")
    values = [v for folder in [*own, *named_folders(raw, by_date)] for v in data(folder)]
    out = []
    for n, line in enumerate(_without_code(raw).splitlines(), 1):
        for m in FIGURE.finditer(line):
            if m.group(1):  # a target, a bound or an approximation
                continue
            for group in (2, 3):
                text = m.group(group)
                if text and not (_found(text, m.group(4), values) or _derived(text, line, m.start(group))):
                    out.append(f"{md.relative_to(REPO)}:{n}: {text}{m.group(4)}")
    return out


def test_every_figure_of_the_results_readmes_is_in_their_data():
    readmes = sorted(RESULTS.rglob("README.md"))
    assert readmes
    found = [f for md in readmes for f in untraced(md, [md.parent])]
    assert not found, "figures in no committed JSON/CSV of their folder (bench/README.md):\n" + "\n".join(found)


def test_every_measured_figure_of_targets_is_in_the_runs_it_dates():
    found = untraced(TARGETS, [], by_date=True)
    assert not found, "figures in no committed JSON of the runs TARGETS.md dates:\n" + "\n".join(found)


def test_the_rule_refuses_a_figure_of_no_run(tmp_path, monkeypatch):
    """On a folder written here: what is in the data, derived from its line,
    a target or approximate passes; a figure of no run is refused."""
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "queries.json").write_text(json.dumps({"results": {"ratio": 1.3258, "p50_ms": 9.4289,
                                                              "samples": list(range(100, 200))}}))
    md = run / "README.md"
    md.write_text("p50 9.43 ms, 1.326× ONNX Runtime (target ≤ 1.0×: missed by 33%), ~5 ms warm, "
                  "`sleep 7 ms` in code\n"
                  "first run 0.928× (lost); 150 ms is only a raw sample\n", encoding="utf-8")
    assert untraced(md, [run]) == ["run/README.md:2: 0.928×", "run/README.md:2: 150ms"]
