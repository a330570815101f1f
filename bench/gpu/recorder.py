"""Runs the GPU script's sections one by one, each isolated (an exception
is recorded and the next section runs), and rewrites ``gpu.json`` and
``gpu.md`` after every section, so a crash or a kill keeps everything done
before it. A watchdog ends a run that overstays its hard limit, after
writing which section it was in."""

from __future__ import annotations

import fnmatch
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Callable

# Exit statuses: a gate/check/section failed; the preflight failed; a
# forced crash (--fail-section NAME=exit); the watchdog's kill.
EXIT_FAILED, EXIT_PREFLIGHT, EXIT_FORCED_CRASH, EXIT_WATCHDOG = 1, 2, 3, 124


class Skip(Exception):
    """Raised by a section that cannot run here (recorded as skipped)."""


class ForcedFailure(RuntimeError):
    """Raised at the start of a section named by ``--fail-section``."""


class Budget:
    def __init__(self, seconds: float):
        self.t0, self.seconds = time.monotonic(), seconds

    @property
    def elapsed(self) -> float:
        return round(time.monotonic() - self.t0, 1)

    def left(self) -> bool:
        return self.elapsed < self.seconds


def parse_failures(spec: str) -> dict[str, str]:
    """``"check/event_wait,minilm/scoring=exit"`` → {pattern: "raise" | "exit"}."""
    out = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        pattern, _, how = item.partition("=")
        how = how or "raise"
        if how not in ("raise", "exit"):
            raise ValueError(f"--fail-section {item!r}: the mode is raise or exit")
        out[pattern] = how
    return out


class Recorder:
    """Owns the result dict and the output files."""

    def __init__(self, out: Path, result: dict, budget: Budget, render: Callable[[dict], str],
                 only: list[str] | None = None, failures: dict[str, str] | None = None):
        self.out, self.result, self.budget, self.render = out, result, budget, render
        self.only = only or []
        self.failures = failures or {}
        self.current: str | None = None
        self.cleanups: list[Callable[[], None]] = []
        result.setdefault("sections", {})
        out.mkdir(parents=True, exist_ok=True)

    def wanted(self, name: str) -> bool:
        """Whether ``--only`` lets this section run (all when not given)."""
        return not self.only or any(fnmatch.fnmatchcase(name, p) for p in self.only)

    def forced(self, name: str) -> None:
        """Fails or crashes here when ``--fail-section`` names ``name``."""
        for pattern, how in self.failures.items():
            if fnmatch.fnmatchcase(name, pattern):
                if how == "exit":
                    print(f"[{self.budget.elapsed:6.1f}s] {name}: forced crash (--fail-section)", flush=True)
                    self.kill_children()
                    os._exit(EXIT_FORCED_CRASH)
                raise ForcedFailure(f"{name}: forced failure (--fail-section)")

    def section(self, name: str, fn: Callable[[], object], verdict: Callable[[object], bool] | None = None,
                budgeted: bool = True, always: bool = False):
        """Runs ``fn`` as section ``name`` and records it as ``ok``,
        ``failed`` (``verdict`` said so), ``error`` (it raised) or
        ``skipped``; returns its value (None unless ok or failed).
        ``always``: runs whatever ``--only`` says (the preflight)."""
        if not always and not self.wanted(name):
            return None
        rec: dict = {}
        if budgeted and not self.budget.left():
            rec = {"status": "skipped", "reason": f"time budget spent ({self.budget.elapsed}s)"}
            return self._store(name, rec)
        print(f"[{self.budget.elapsed:6.1f}s] {name}", flush=True)
        self.current, start = name, time.monotonic()
        value = None
        try:
            self.forced(name)
            value = fn()
            ok = verdict(value) if verdict is not None else True
            rec = {"status": "ok" if ok else "failed", "result": value}
        except Skip as e:
            rec = {"status": "skipped", "reason": str(e)}
        except Exception as e:  # one broken section must not lose the others
            rec = {"status": "error", "error": f"{type(e).__name__}: {e}",
                   "traceback": traceback.format_exc()[-3000:]}
            print(f"    {name}: {rec['error']}", file=sys.stderr, flush=True)
        finally:
            self.current = None
        rec["seconds"] = round(time.monotonic() - start, 2)
        self._store(name, rec)
        return value if rec["status"] in ("ok", "failed") else None

    def skip(self, name: str, reason: str) -> None:
        if self.wanted(name):
            self._store(name, {"status": "skipped", "reason": reason})

    def _store(self, name: str, rec: dict) -> None:
        self.result["sections"][name] = rec
        self.write()

    def write(self) -> None:
        """Both files, each replaced atomically (a reader never sees half)."""
        self.result["seconds"] = self.budget.elapsed
        for fname, text in (("gpu.json", json.dumps(self.result, indent=1, default=str) + "\n"),
                            ("gpu.md", self.render(self.result))):
            tmp = self.out / f".{fname}.{threading.get_ident()}.tmp"  # the watchdog may write too
            tmp.write_text(text)
            tmp.replace(self.out / fname)

    def failed(self) -> list[str]:
        return [n for n, r in self.result["sections"].items() if r["status"] in ("failed", "error")]

    # Child processes and the watchdog.

    def on_exit(self, cleanup: Callable[[], None]) -> None:
        self.cleanups.append(cleanup)

    def kill_children(self) -> None:
        for c in self.cleanups:
            try:
                c()
            except Exception:  # best effort while exiting
                pass

    def watchdog(self, seconds: float) -> threading.Timer:
        """After ``seconds``, records where the run was, kills the servers
        it started and exits with EXIT_WATCHDOG (a hung kernel or server
        must not eat the rest of the machine's time)."""
        def fire():
            self.result["watchdog"] = {"after_s": seconds, "section": self.current}
            print(f"[{self.budget.elapsed:6.1f}s] watchdog: still in {self.current} after {seconds}s; "
                  "exiting", flush=True)
            try:
                self.write()
            finally:
                self.kill_children()
                os._exit(EXIT_WATCHDOG)

        t = threading.Timer(seconds, fire)
        t.daemon = True
        t.start()
        return t
