"""Progress: a tqdm bar on a terminal (documents/s, tokens/s, ETA), plain
lines every few seconds otherwise (logs, CI). Rows a resumed run finds
already done count toward the total but not toward the rates."""

from __future__ import annotations

import sys
import threading
import time


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def retry_line(status: int, message: str, delay: float) -> str:
    """What a retry says (status 0: no answer came)."""
    return f"retrying in {delay:.1f}s: {f'HTTP {status}: ' if status else ''}{message[:160]}"


class Progress:
    def __init__(self, total: int | None, every: float = 10.0, stream=None, bar: bool | None = None):
        self.stream = stream or sys.stderr
        self.total = total
        self.every = every
        self.done = self.skipped = self.tokens = self.bad = self.retries = 0
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._last_line = self._started
        use_bar = self.stream.isatty() if bar is None else bar
        self._bar = None
        if use_bar:
            try:
                from tqdm import tqdm
            except ImportError:  # plain lines, as off a terminal
                return
            self._bar = tqdm(total=total, unit="doc", file=self.stream, dynamic_ncols=True, smoothing=0.1)

    def skip(self, rows: int) -> None:
        """Rows a previous run finished."""
        with self._lock:
            self.skipped += rows
            self.done += rows
            if self._bar is not None:
                self._bar.update(rows)
                # The rate shown counts only this run's rows.
                self._bar.start_t = time.time()
                self._bar.last_print_n = self._bar.n

    def add(self, rows: int, tokens: int, bad: int) -> None:
        with self._lock:
            self.done += rows
            self.tokens += tokens
            self.bad += bad
            if self._bar is not None:
                self._bar.set_postfix_str(f"{self._rate(self.tokens):,.0f} tok/s, {self.bad} bad", refresh=False)
                self._bar.update(rows)
            elif time.monotonic() - self._last_line >= self.every:
                self._last_line = time.monotonic()
                self.stream.write(self.line() + "\n")
                self.stream.flush()

    def retry(self, status: int, message: str, delay: float) -> None:
        with self._lock:
            self.retries += 1
            text = retry_line(status, message, delay)
            if self._bar is not None:
                self._bar.write(text, file=self.stream)
            else:
                self.stream.write(text + "\n")
                self.stream.flush()

    def _rate(self, n: int) -> float:
        return n / max(1e-9, time.monotonic() - self._started)

    def line(self) -> str:
        """One plain progress line."""
        new = self.done - self.skipped
        rate = self._rate(new)
        left = None if not self.total or not rate else (self.total - self.done) / rate
        total = f"/{self.total:,}" if self.total else ""
        pct = f" ({100 * self.done / self.total:.1f}%)" if self.total else ""
        return (f"embedded {self.done:,}{total} docs{pct}, {rate:,.0f} docs/s, "
                f"{self._rate(self.tokens):,.0f} tokens/s, ETA {_eta(left)}, {self.bad} bad rows")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
