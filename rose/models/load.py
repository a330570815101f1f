"""A model built and its weights read: what the engine and every runtime
that keeps its own copy of the model (the ONNX export, the bfloat16 twin)
call. Imports nothing above the models."""

from __future__ import annotations

import logging

from ..attention import AttentionBackend
from ..config import ModelSpec
from ..loader import WeightReader, read_weights, strip_prefix
from . import EmbeddingModel, build_model

log = logging.getLogger("rose")


def load_model(spec: ModelSpec, backend: AttentionBackend) -> EmbeddingModel:
    """A model built with ``backend`` and its weights read from the
    directory: float32, on the CPU, in eval mode."""
    model = build_model(spec, backend)
    tensors = {} if spec.model_type == "null" else read_weights(spec.path)
    weights = WeightReader(strip_prefix(tensors), str(spec.path))
    model.load(weights)
    leftover = weights.unused(ignore=("pooler.", "position_ids", "lm_head."))
    if leftover:
        log.warning("unused weights in %s: %s", spec.path, ", ".join(leftover[:8]))
    return model.eval()
