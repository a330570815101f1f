"""What every model gives the engine: an encoder over the flat token axis
plus the heads that turn hidden states into each output kind."""

from __future__ import annotations

import abc
from dataclasses import dataclass

import torch
from torch import nn

from ..attention import AttnPlan
from ..interface import OutputKind
from ..loader import WeightReader
from ..pooling import finish_dense


@dataclass
class StepInputs:
    """One step's inputs, already on the model's device."""

    token_ids: torch.Tensor  # int32 [T]
    positions: torch.Tensor  # int32 [T], position of each token in its sequence
    seg_ids: torch.Tensor  # int64 [T], sequence index of each token
    cu_seqlens: torch.Tensor  # int32 [n + 1]
    inv_lengths: torch.Tensor  # float32 [n]
    dimensions: torch.Tensor  # int32 [n] (dense)
    normalize: torch.Tensor  # bool [n] (dense)
    plan: AttnPlan


@dataclass(frozen=True)
class ImageInput:
    """What a model that embeds images takes: float32 normalised pixels
    ``[N, channels, height, width]``, each image costing ``tokens`` tokens
    of its vision tower (patches, and CLIP's class token)."""

    channels: int
    height: int
    width: int
    tokens: int

    @property
    def values(self) -> int:
        """Pixel values of one image."""
        return self.channels * self.height * self.width


class EmbeddingModel(nn.Module, abc.ABC):
    """Base class: subclasses implement ``encode`` and ``load`` and set the
    attributes."""

    kinds: tuple[OutputKind, ...] = (OutputKind.DENSE,)
    dimension: int = 0
    multi_vector_dimension: int = 0
    causal: bool = False
    # Set by models that embed images (``embed_images``); None: text only.
    image_input: ImageInput | None = None

    @abc.abstractmethod
    def encode(self, x: StepInputs) -> torch.Tensor:
        """Hidden states [T, H] for the flat batch."""

    @abc.abstractmethod
    def load(self, w: WeightReader) -> None:
        """Copies the model's weights in (``load_model``)."""

    def adapter_layers(self) -> list[nn.Module]:
        """The transformer layers a LoRA adapter's matrices go into, in
        order, each declaring ``peft_names`` and ``peft_parts``
        (``rose/adapters/placement.py``); empty for a family that takes no
        adapters."""
        return []

    def dense(self, hidden: torch.Tensor, x: StepInputs) -> torch.Tensor:
        """Pooled vector per sequence before Matryoshka/normalisation: the
        model's ``sentence`` module (a ``SentenceHead``: pooling and the
        sentence-transformers modules after it)."""
        sentence = getattr(self, "sentence", None)
        if sentence is None:
            raise ValueError("this model does not produce dense outputs")
        return sentence(hidden, x)

    def forward(self, kind: OutputKind, x: StepInputs) -> torch.Tensor:
        hidden = self.encode(x)
        if kind is OutputKind.DENSE:
            return finish_dense(self.dense(hidden, x), x.dimensions, x.normalize)
        if kind is OutputKind.TOKEN_STATES:
            return hidden.float()
        return self.head(kind, hidden, x)

    def image_plan(self, images: int, device: torch.device) -> AttnPlan:
        """The attention plan of a step of ``images`` images, for steps on
        static buffers to make once (models with ``image_input``)."""
        raise ValueError("this model does not embed images")

    def embed_images(self, pixels: torch.Tensor, dimensions: torch.Tensor, normalize: torch.Tensor,
                     plan: AttnPlan | None = None) -> torch.Tensor:
        """Dense rows ``[N, dimension]`` of images ``[N, C, H, W]``, cut
        to ``dimensions`` and normalised where ``normalize`` (bool [N]) is
        set, as ``forward`` finishes dense text rows."""
        raise ValueError("this model does not embed images")

    def head(self, kind: OutputKind, hidden: torch.Tensor, x: StepInputs) -> torch.Tensor:
        """Outputs other than dense (sparse, multi-vector, score)."""
        raise ValueError(f"this model does not produce {kind.value} outputs")
