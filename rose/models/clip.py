"""CLIP and SigLIP dual encoders: their text towers, and ``ClipModel``,
which builds both towers from a model directory and embeds images and
token ids into the shared space.

``ClipModel`` is a self-contained API whose outputs are the projected,
unnormalised features transformers' ``get_image_features`` and
``get_text_features`` return; ``DualEncoder`` is the same towers as the
engine's model (text steps on the flat token axis, ``embed_images`` for
image steps), its dense rows finished (Matryoshka cut, normalisation) as
every dense model's are. SigLIP 2 (``siglip2``, NaFlex: variable resolution, patches
given pre-cut with a pixel mask and resized position embeddings) is
refused."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch import nn

from ..attention import AttentionBackend, AttnPlan, AttnShape
from ..config import ModelSpec
from ..errors import InvalidBatchError, ModelLoadError
from ..interface import OutputKind
from ..loader import WeightReader, read_weights
from ..pooling import finish_dense
from ..st_modules import read_json
from .base import EmbeddingModel, ImageInput, StepInputs
from .layers import copy_linear, copy_norm
from .vit import FAMILIES, Encoder, VisionTower, attn_shape, ragged_plan

log = logging.getLogger("rose")

# CLIP configs written before transformers' PR #24773 say eos_token_id 2;
# for them the pooled token is the largest id in the sequence (the
# end-of-text token is the last in CLIP's vocabulary), as transformers does.
_LEGACY_EOS = 2
# CLIPTextConfig's default when config.json leaves eos_token_id out.
_DEFAULT_EOS = 49407


class TextTower(nn.Module):
    """CLIP's or SigLIP's text model (``text_config``) with its projection:
    sequences of token ids, ragged on the flat axis → ``[n, D]``.

    CLIP: causal attention; the pooled state is the final-norm state at the
    first end-of-text token (``eos_token_id``), or at the largest id for
    legacy configs, then ``text_projection`` (no bias). SigLIP:
    bidirectional; the pooled state is the last token's, then
    ``text_model.head`` (with bias). SigLIP was trained on text padded to
    a fixed length (64 in the released checkpoints) and pools whatever sits
    last, so a host pads ids before they get here, as its processor's
    ``padding="max_length"`` does."""

    def __init__(self, cfg: dict, backend: AttentionBackend, family: str, projection_dim: int):
        super().__init__()
        if family not in FAMILIES:
            raise ModelLoadError(f"text tower family {family!r} is not one of {', '.join(FAMILIES)}")
        hidden = int(cfg["hidden_size"])
        self.family = family
        self.causal = family == "clip"
        eos = cfg.get("eos_token_id", _DEFAULT_EOS)
        if self.causal and not isinstance(eos, int):
            raise ModelLoadError(f"CLIP text_config eos_token_id must be one token id, got {eos!r}")
        self.eos = eos if self.causal else None
        self.token = nn.Embedding(int(cfg["vocab_size"]), hidden)
        self.position = nn.Embedding(int(cfg["max_position_embeddings"]), hidden)
        self.encoder = Encoder(cfg, backend)
        self.final_norm = nn.LayerNorm(hidden, eps=float(cfg.get("layer_norm_eps", 1e-5)))
        self.projection = nn.Linear(hidden, projection_dim, bias=not self.causal)
        self.backend = backend
        self.dimension = projection_dim

    def forward(self, ids: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """``ids``: int [T], the sequences of ``lengths`` end to end."""
        dev = ids.device
        plan = ragged_plan(self.backend, lengths, dev, self.causal)
        cu = plan.cu_seqlens.long()
        seg = torch.repeat_interleave(torch.arange(len(lengths), device=dev), cu[1:] - cu[:-1])
        positions = torch.arange(ids.shape[0], device=dev) - cu[seg]
        h = self.states(ids, positions, plan)
        return self.projection(h[self.pooled_rows(ids, cu, seg)])

    def states(self, ids: torch.Tensor, positions: torch.Tensor, plan: AttnPlan) -> torch.Tensor:
        """Final-norm states ``[T, hidden]`` (transformers' ``last_hidden_state``)."""
        return self.final_norm(self.encoder(self.token(ids) + self.position(positions), plan))

    def pooled_rows(self, ids: torch.Tensor, cu: torch.Tensor, seg: torch.Tensor) -> torch.Tensor:
        """Flat index of each sequence's pooled token. Fixed shapes and no
        host sync, so a CUDA graph can capture it."""
        if self.eos is None:
            return cu[1:] - 1
        n, t = cu.numel() - 1, ids.shape[0]
        ids, seg = ids.long(), seg.long()
        if self.eos == _LEGACY_EOS:
            target = torch.full((n,), -1, dtype=torch.long, device=ids.device).scatter_reduce(0, seg, ids, "amax")
            hit = ids == target[seg]
        else:
            hit = ids == self.eos
        index = torch.arange(t, device=ids.device)
        candidates = torch.where(hit, index, t)
        first = torch.full((n,), t, dtype=torch.long, device=ids.device).scatter_reduce(0, seg, candidates, "amin")
        # No end-of-text token: transformers' argmax over no match is the first position.
        return torch.where(first == t, cu[:-1].long(), first)

    def load(self, w: WeightReader, prefix: str = "text_model.", projection: str = "text_projection") -> None:
        e = f"{prefix}embeddings."
        with torch.no_grad():
            self.token.weight.copy_(w.take(f"{e}token_embedding.weight"))
            self.position.weight.copy_(w.take(f"{e}position_embedding.weight"))
            copy_norm(self.final_norm, w, f"{prefix}final_layer_norm")
            copy_linear(self.projection, w, projection)
        self.encoder.load(w, f"{prefix}encoder.")


def _towers(config: dict) -> tuple[str, dict, dict]:
    """(family, text_config, vision_config) of a CLIP or SigLIP config.json."""
    model_type = str(config.get("model_type", ""))
    if model_type == "siglip2":
        raise ModelLoadError(
            "siglip2 is not supported: its NaFlex vision tower (variable resolution, pre-cut "
            "patches with a pixel mask, resized position embeddings) is not implemented"
        )
    if model_type not in FAMILIES:
        raise ModelLoadError(f"model_type {model_type!r} is not a dual encoder ROSE builds ({', '.join(FAMILIES)})")
    text, vision = config.get("text_config"), config.get("vision_config")
    if not isinstance(text, dict) or not isinstance(vision, dict):
        raise ModelLoadError(f"a {model_type} config.json needs both text_config and vision_config")
    return model_type, text, vision


def attn_shapes(config: dict) -> tuple[AttnShape, AttnShape]:
    """(text, vision) attention shapes of a CLIP or SigLIP config.json, for
    choosing each tower's backend before building the model."""
    family, text, vision = _towers(config)
    return attn_shape(text, causal=family == "clip"), attn_shape(vision, causal=False)


class ClipModel(nn.Module):
    """A CLIP or SigLIP model (``model_type`` ``clip`` or ``siglip``): both
    towers, built on the CPU in float32; move it with ``.to()``.

    Image and text features are those of transformers' ``CLIPModel`` /
    ``SiglipModel`` ``get_image_features`` / ``get_text_features``:
    projected, not normalised."""

    def __init__(self, config: dict, backend: AttentionBackend, text_backend: AttentionBackend | None = None):
        super().__init__()
        family, text, vision = _towers(config)
        self.family = family
        if family == "clip":
            dim = int(config.get("projection_dim", 512))
            self.vision = VisionTower(vision, backend, family, projection_dim=dim)
        else:
            self.vision = VisionTower(vision, backend, family)
            dim = int(text.get("projection_size") or text["hidden_size"])
        self.text = TextTower(text, text_backend or backend, family, dim)
        if self.vision.dimension != self.text.dimension:
            raise ModelLoadError(
                f"{family} image features ({self.vision.dimension}) and text features "
                f"({self.text.dimension}) differ in size"
            )
        self.dimension = dim
        self.image_size = self.vision.image_size

    @classmethod
    def from_dir(
        cls, path: Path | str, backend: AttentionBackend, text_backend: AttentionBackend | None = None
    ) -> ClipModel:
        """The model of a directory (config.json and its weights), in eval
        mode. ``backend`` serves both towers unless ``text_backend`` is
        given (``attn_shapes`` says what each must support)."""
        path = Path(path)
        config = read_json(path / "config.json")
        if not isinstance(config, dict):
            raise ModelLoadError(f"{path} has no config.json")
        model = cls(config, backend, text_backend)
        w = WeightReader(read_weights(path), str(path))
        model.load(w)
        leftover = w.unused(ignore=("logit_scale", "logit_bias", "position_ids"))
        if leftover:
            log.warning("unused weights in %s: %s", path, ", ".join(leftover[:8]))
        return model.eval()

    def load(self, w: WeightReader) -> None:
        if self.family == "clip":
            self.vision.load(w, "vision_model.", "visual_projection")
            self.text.load(w, "text_model.", "text_projection")
        else:
            self.vision.load(w, "vision_model.")
            self.text.load(w, "text_model.", "text_model.head")

    @property
    def device(self) -> torch.device:
        return self.text.token.weight.device

    @torch.inference_mode()
    def embed_images(self, pixels: torch.Tensor) -> torch.Tensor:
        """Image features ``[N, D]`` (float32) of preprocessed pixels
        ``[N, 3, S, S]`` at the model's ``image_size`` S."""
        return self.vision(pixels.to(self.device)).float()

    @torch.inference_mode()
    def embed_texts(self, ids: list[list[int]]) -> torch.Tensor:
        """Text features ``[n, D]`` (float32) of token id sequences (as the
        model's tokenizer makes them, special tokens included), run as one
        ragged batch."""
        lengths = [len(s) for s in ids]
        limit = self.text.position.num_embeddings
        if not ids or min(lengths) == 0 or max(lengths) > limit:
            raise InvalidBatchError(
                f"texts must be 1 to {limit} tokens each, and at least one; got lengths {lengths[:8]}"
            )
        flat = torch.tensor([t for s in ids for t in s], dtype=torch.long)
        if flat.min() < 0 or flat.max() >= self.text.token.num_embeddings:
            raise InvalidBatchError(f"token ids must be in [0, {self.text.token.num_embeddings})")
        return self.text(flat.to(self.device), lengths).float()


class DualEncoder(EmbeddingModel):
    """A CLIP or SigLIP model as the engine serves it: text steps run the
    text tower on the flat token axis (its plan from the engine's backend,
    causal for CLIP), then its pooling and projection; image steps run the
    vision tower (``embed_images``). Both end in the shared space, dense."""

    kinds = (OutputKind.DENSE,)

    def __init__(self, spec: ModelSpec, backend: AttentionBackend):
        super().__init__()
        self.towers = ClipModel(spec.hf_config, backend)
        vision = self.towers.vision
        self.causal = self.towers.text.causal
        self.dimension = self.towers.dimension
        self.image_input = ImageInput(vision.channels, vision.image_size, vision.image_size, vision.tokens)
        # SigLIP pools the last position of text padded to its fixed length
        # (its processor's padding="max_length"): the host pads, as it
        # tokenizes. CLIP pools its end-of-text token and needs no padding.
        text = spec.hf_config.get("text_config") or {}
        self.text_pad_to = 0 if self.causal else int(text.get("max_position_embeddings", 64))
        pad = text.get("pad_token_id")
        self.pad_token_id = 0 if self.causal else int(1 if pad is None else pad)

    def encode(self, x: StepInputs) -> torch.Tensor:
        text = self.towers.text
        # A padded step's filler segment may run past the position table
        # (real sequences were checked against it); its rows are dropped.
        positions = x.positions.clamp_max(text.position.num_embeddings - 1)
        return text.states(x.token_ids, positions, x.plan)

    def dense(self, hidden: torch.Tensor, x: StepInputs) -> torch.Tensor:
        text = self.towers.text
        return text.projection(hidden[text.pooled_rows(x.token_ids, x.cu_seqlens.long(), x.seg_ids)]).float()

    def image_plan(self, images: int, device: torch.device) -> AttnPlan:
        return self.towers.vision.plan(images, device)

    def embed_images(self, pixels: torch.Tensor, dimensions: torch.Tensor, normalize: torch.Tensor,
                     plan: AttnPlan | None = None) -> torch.Tensor:
        return finish_dense(self.towers.vision(pixels, plan).float(), dimensions, normalize)

    def load(self, w: WeightReader) -> None:
        self.towers.load(w)
        # The contrastive loss's temperature and bias: training only.
        for name in ("logit_scale", "logit_bias"):
            if name in w:
                w.take(name)
