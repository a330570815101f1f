"""Lazily captured whole-model CUDA graphs.

One graph per configuration = (output kind, sequence count, padded token
count); an image step's configuration is its image count padded to a power
of two (``image_key``), under a dispatcher of its own. Token counts pad up to buckets (multiples of ``fine_step`` up to
``fine_limit``, then of ``coarse_step``, up to ``max_tokens``). Per
configuration, the first hit runs eagerly on the static buffers (kernels are
chosen, workspaces allocated), the second captures and replays, later hits
only replay. Nothing is captured at start-up unless asked for.

The ``Dispatcher`` is the single owner of which configurations exist and in
which state they are; it holds no tensors, so it is tested on the CPU.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from dataclasses import dataclass

from ..interface import OutputKind


@dataclass(frozen=True)
class GraphSettings:
    """Bucket grid and limits. The defaults suit a sub-1B model."""

    max_tokens: int = 8192
    max_sequences: int = 64
    fine_step: int = 64
    fine_limit: int = 1024
    coarse_step: int = 256
    # Image steps: image counts pad up to powers of two, up to this many.
    max_images: int = 64

    def __post_init__(self):
        if min(self.max_tokens, self.max_sequences, self.fine_step, self.coarse_step, self.max_images) < 1:
            raise ValueError("graph bucket settings must be positive")
        if self.fine_limit % self.fine_step or self.coarse_step % self.fine_step:
            raise ValueError("fine_limit and coarse_step must be multiples of fine_step")

    def bucket(self, tokens: int) -> int | None:
        """Padded token count for a batch of ``tokens`` real tokens, or None
        when it is too large for a graph. Always leaves at least one filler
        token, so the filler segment is never empty."""
        need = tokens + 1
        if need <= self.fine_limit:
            padded = -(-need // self.fine_step) * self.fine_step
        else:
            padded = -(-need // self.coarse_step) * self.coarse_step
        return padded if padded <= self.max_tokens else None

    def image_bucket(self, images: int) -> int | None:
        """Padded image count (the next power of two) for a step of
        ``images`` images, or None when it runs eagerly (over
        ``max_images``)."""
        padded = 1 << max(images - 1, 0).bit_length()
        return padded if 0 < images and padded <= self.max_images else None

    def buckets(self) -> list[int]:
        """Every padded token count the grid can produce."""
        out = list(range(self.fine_step, min(self.fine_limit, self.max_tokens) + 1, self.fine_step))
        t = self.fine_limit + self.coarse_step
        while t <= self.max_tokens:
            out.append(t)
            t += self.coarse_step
        return out


@dataclass(frozen=True)
class GraphKey:
    kind: OutputKind
    sequences: int
    tokens: int  # padded

    def __str__(self) -> str:
        return f"{self.kind.value}:{self.sequences}x{self.tokens}"

    @classmethod
    def parse(cls, text: str, default_kind: OutputKind = OutputKind.DENSE) -> "GraphKey":
        """``"[kind:]SEQxTOKENS"``, e.g. ``"1x128"`` or ``"dense:4x512"``."""
        kind = default_kind
        if ":" in text:
            k, text = text.split(":", 1)
            kind = OutputKind(k)
        try:
            seqs, tokens = (int(x) for x in text.lower().split("x"))
        except ValueError:
            raise ValueError(f"graph configuration {text!r} is not [kind:]SEQxTOKENS") from None
        return cls(kind, seqs, tokens)


class State(enum.Enum):
    COLD = "cold"  # never seen
    WARM = "warm"  # ran eagerly once on its static buffers
    CAPTURED = "captured"  # replays a graph
    FAILED = "failed"  # capture failed: always eager on static buffers


class Action(enum.Enum):
    EAGER = "eager"  # no graph for this batch (too large, or graphs off)
    WARMUP = "warmup"  # first hit: eager on static buffers
    CAPTURE = "capture"  # second hit: capture, then replay
    REPLAY = "replay"


class Dispatcher:
    """Decides, per batch, eager vs warm-up vs capture vs replay."""

    def __init__(self, settings: GraphSettings, enabled: bool = True):
        self.settings = settings
        self.enabled = enabled
        self._states: dict[GraphKey, State] = {}
        self._lock = threading.Lock()

    def key(self, kind: OutputKind, sequences: int, tokens: int) -> GraphKey | None:
        """The configuration a batch falls into, or None if it runs eagerly."""
        if not self.enabled or sequences > self.settings.max_sequences:
            return None
        padded = self.settings.bucket(tokens)
        return None if padded is None else GraphKey(kind, sequences, padded)

    def image_key(self, images: int, tokens_per_image: int) -> GraphKey | None:
        """The configuration of an image step (images padded to a power of
        two, ``tokens`` what the vision tower computes), or None if it runs
        eagerly."""
        if not self.enabled:
            return None
        padded = self.settings.image_bucket(images)
        return None if padded is None else GraphKey(OutputKind.DENSE, padded, padded * tokens_per_image)

    def hit(self, key: GraphKey | None) -> Action:
        """Records a hit and says what to do. The caller reports the outcome
        of a capture with ``captured`` or ``failed``."""
        if key is None:
            return Action.EAGER
        with self._lock:
            state = self._states.get(key, State.COLD)
            if state is State.COLD:
                self._states[key] = State.WARM
                return Action.WARMUP
            if state is State.WARM:
                return Action.CAPTURE
            if state is State.CAPTURED:
                return Action.REPLAY
            return Action.WARMUP  # FAILED: static buffers, no graph

    def captured(self, key: GraphKey) -> None:
        with self._lock:
            self._states[key] = State.CAPTURED

    def failed(self, key: GraphKey) -> None:
        with self._lock:
            self._states[key] = State.FAILED

    def state(self, key: GraphKey) -> State:
        with self._lock:
            return self._states.get(key, State.COLD)

    def counts(self) -> dict[str, int]:
        with self._lock:
            out = {s.value: 0 for s in State}
            for s in self._states.values():
                out[s.value] += 1
            return out


def capture_into(entry, key: GraphKey, dispatcher: Dispatcher, device, what: str, capture) -> float:
    """Captures one configuration's graph into ``entry`` (its ``graph`` and
    ``out``) with ``capture()``, telling ``dispatcher`` how it went; a
    capture that fails leaves the configuration eager on its static
    buffers (``what`` names it in the log). Seconds spent, 0 on a device
    without graphs. Shared by text (``static.py``) and image steps."""
    started = time.perf_counter()
    try:
        graph, out = capture()
    except Exception as e:  # a kernel that cannot be captured: stay eager
        if device.is_sticky(e):
            raise
        logging.getLogger("rose.graphs").exception("capture of %s failed; it will run eagerly on static buffers",
                                                   what)
        dispatcher.failed(key)
        return time.perf_counter() - started
    entry.graph, entry.out = graph, out
    dispatcher.captured(key)
    if graph is None:
        return 0.0
    elapsed = time.perf_counter() - started
    logging.getLogger("rose.graphs").info("captured %s in %.0f ms", what, elapsed * 1e3)
    return elapsed
