"""Intra-op threads per CPU step. A forward pass over a handful of tokens
is about a hundred small operations; spreading each over several threads
costs more in wake-ups than it saves, so small steps run on one thread and
larger ones use the whole budget (measured in bench/results: the ``queries``
benchmark). The setting is per thread (OpenMP's is), and a step may run on
any host thread, so it is applied on the thread that runs the step."""

from __future__ import annotations

import threading

import torch

# Steps with fewer real tokens than this run on one thread by default.
SMALL_STEP_TOKENS = 32


class ThreadBudget:
    def __init__(self, small_step_tokens: int = SMALL_STEP_TOKENS, budget: int | None = None):
        self.small_step_tokens = small_step_tokens
        self.budget = budget or torch.get_num_threads()
        self._local = threading.local()

    def apply(self, tokens: int) -> None:
        want = 1 if tokens < self.small_step_tokens else self.budget
        if getattr(self._local, "threads", None) != want:
            torch.set_num_threads(want)
            self._local.threads = want
