"""DeBERTa-v2/v3 sequence classifiers (``DebertaV2ForSequenceClassification``:
mxbai-rerank-base-v1, cross-encoder/nli-deberta-v3-base) over the flat
token axis: BERT-shaped post-norm layers whose attention adds DeBERTa's
disentangled relative-position terms.

For query i and key j, with r = the log-bucketed distance i - j and
R = the (layer-normed) relative embedding table projected per layer,

    score(i, j) = (q_i·k_j + q_i·R_k[r] + k_j·R_q[r]) / sqrt(d · factor)

(the two extra terms are "c2p" and "p2c"; ``factor`` is 1 + how many of
them the config names). The extra terms depend on each layer's q and k, so
every layer builds its bias on padded per-sequence blocks
(``rose.models.padded``) and runs SDPA with it as an additive mask; the
bucket index, the key padding and the rows of the table a step can reach
are built once per step, on the device, from ``cu_seqlens`` and the
step's length bound only (capture-safe).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import AttentionBackend
from ..attention.sdpa import PaddedLayout
from ..config import ModelSpec
from ..errors import ModelLoadError
from ..interface import OutputKind
from ..loader import WeightReader
from .base import EmbeddingModel, StepInputs
from .heads import ClassifierHead
from .layers import activation, copy_fused, copy_linear, copy_norm
from .padded import from_blocks, to_blocks
from .rerank import second_segment


@dataclass(frozen=True)
class RelativeSettings:
    """How a config places relative positions (transformers' defaults)."""

    enabled: bool  # relative_attention
    terms: frozenset[str]  # pos_att_type ⊆ {"c2p", "p2c"}
    buckets: int  # position_buckets (≤ 0: no log buckets)
    max_relative: int  # max_relative_positions, else max_position_embeddings
    share_key: bool  # share_att_key: positions go through the content q/k projections
    norm_table: bool  # norm_rel_ebd has "layer_norm"

    @classmethod
    def from_config(cls, cfg: dict) -> "RelativeSettings":
        terms = cfg.get("pos_att_type") or []
        if isinstance(terms, str):
            terms = terms.lower().split("|")
        terms = frozenset(t.strip() for t in terms if t.strip())
        if not terms <= {"c2p", "p2c"}:
            raise ModelLoadError(f"DeBERTa pos_att_type {sorted(terms)} is not a subset of ['c2p', 'p2c']")
        max_relative = int(cfg.get("max_relative_positions", -1))
        if max_relative < 1:
            max_relative = int(cfg.get("max_position_embeddings", 512))
        norm = {x.strip() for x in str(cfg.get("norm_rel_ebd", "none")).lower().split("|")}
        return cls(bool(cfg.get("relative_attention", False)), terms, int(cfg.get("position_buckets", -1)),
                   max_relative, bool(cfg.get("share_att_key", False)), "layer_norm" in norm)

    @property
    def span(self) -> int:
        """Half the relative table's rows: distances run over ±span."""
        return self.buckets if self.buckets > 0 else self.max_relative

    @property
    def scale_factor(self) -> int:
        return 1 + len(self.terms)

    def bucket(self, rel: torch.Tensor) -> torch.Tensor:
        """Distances → table offsets: exact within ±buckets/2, then
        logarithmic up to max_relative (float32 steps as transformers', so
        the ceil lands on the same side)."""
        if self.buckets <= 0:
            return rel
        mid = self.buckets // 2
        far = torch.where(rel.abs() < mid, mid - 1, rel.abs())
        log_pos = torch.ceil(torch.log(far / mid) / _log_ratio(self.max_relative, mid) * (mid - 1)) + mid
        return torch.where(far <= mid, rel.float(), log_pos * torch.sign(rel)).long()

    def rows(self, width: int) -> tuple[int, int]:
        """The table rows [lo, hi) that sequences of up to ``width`` tokens
        reach (a host computation on ``width`` alone)."""
        return _rows(self, width)


@lru_cache(maxsize=None)
def _log_ratio(max_relative: int, mid: int) -> float:
    # transformers takes this log of a float32 tensor; the same value here.
    return float(torch.log(torch.tensor((max_relative - 1) / mid)))


@lru_cache(maxsize=64)
def _rows(rs: RelativeSettings, width: int) -> tuple[int, int]:
    reach = int(rs.bucket(torch.arange(width)).abs().max())
    return max(rs.span - reach, 0), min(rs.span + reach + 1, 2 * rs.span)


@dataclass
class RelativeStep:
    """One step's relative-attention state, shared by every layer."""

    layout: PaddedLayout
    index: torch.Tensor  # [L, L] row of the sliced table for (query i, key j)
    table: torch.Tensor | None  # [P, hidden], the sliced (normed) relative embeddings


class DisentangledLayer(nn.Module):
    """A post-norm layer whose attention adds the c2p/p2c terms."""

    def __init__(self, cfg: dict, rs: RelativeSettings):
        super().__init__()
        hidden = int(cfg["hidden_size"])
        self.heads = int(cfg["num_attention_heads"])
        self.head_dim = hidden // self.heads
        self.rs = rs
        self.scale = 1.0 / math.sqrt(self.head_dim * rs.scale_factor)
        eps = float(cfg.get("layer_norm_eps", 1e-7))
        self.qkv = nn.Linear(hidden, 3 * hidden)
        # positions() projects the relative table with its query/key rows.
        self.qkv.weight_read_directly = True  # type: ignore[assignment]  # a flag; setattr is typed for tensors
        # Without share_att_key, positions have their own projections.
        separate = rs.enabled and not rs.share_key
        self.pos_query = nn.Linear(hidden, hidden) if separate and "p2c" in rs.terms else None
        self.pos_key = nn.Linear(hidden, hidden) if separate and "c2p" in rs.terms else None
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_norm = nn.LayerNorm(hidden, eps=eps)
        self.ffn_in = nn.Linear(hidden, int(cfg["intermediate_size"]))
        self.ffn_out = nn.Linear(int(cfg["intermediate_size"]), hidden)
        self.ffn_norm = nn.LayerNorm(hidden, eps=eps)
        self.act = activation(str(cfg.get("hidden_act", "gelu")))

    def forward(self, h: torch.Tensor, step: RelativeStep) -> torch.Tensor:
        t = h.shape[0]
        q, k, v = (to_blocks(x, step.layout) for x in self.qkv(h).view(t, 3, self.heads, self.head_dim).unbind(1))
        mask = step.layout.mask  # key padding
        if step.table is not None:
            mask = torch.where(mask, self.relative_bias(q, k, step), float("-inf"))
        a = from_blocks(F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale), step.layout)
        h = self.attn_norm(h + self.attn_out(a.reshape(t, -1)))
        return self.ffn_norm(h + self.ffn_out(self.act(self.ffn_in(h))))

    def relative_bias(self, q: torch.Tensor, k: torch.Tensor, step: RelativeStep) -> torch.Tensor:
        """(c2p + p2c) · scale, [n, heads, L, L]."""
        assert step.table is not None  # forward() calls this only with a table
        pos_q, pos_k = self.positions(step.table)
        n, heads, width, _ = q.shape
        index = step.index.expand(n, heads, width, width)
        bias = q.new_zeros(())
        # positions() projects keys for c2p and queries for p2c.
        if "c2p" in self.rs.terms:  # query i against the position of (i - j)
            assert pos_k is not None
            bias = bias + (q @ pos_k.transpose(-1, -2)).gather(-1, index)
        if "p2c" in self.rs.terms:  # key j against the same position, read by key then transposed
            assert pos_q is not None
            bias = bias + (k @ pos_q.transpose(-1, -2)).gather(-1, index.transpose(-1, -2)).transpose(-1, -2)
        return bias * self.scale

    def positions(self, table: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The relative table projected to per-head queries and keys, [heads, P, d]."""
        def heads(x):
            return x.view(x.shape[0], self.heads, self.head_dim).transpose(0, 1)

        if self.rs.share_key:
            hidden = self.heads * self.head_dim
            both = F.linear(table, self.qkv.weight[:2 * hidden], self.qkv.bias[:2 * hidden])
            pos_q, pos_k = both.split(hidden, dim=-1)
            return heads(pos_q), heads(pos_k)
        return (heads(self.pos_query(table)) if self.pos_query is not None else None,
                heads(self.pos_key(table)) if self.pos_key is not None else None)

    def load(self, w: WeightReader, p: str) -> None:
        att = f"{p}attention."
        with torch.no_grad():
            copy_fused(self.qkv, w, [f"{att}self.{n}_proj" for n in ("query", "key", "value")])
            if self.pos_query is not None:
                copy_linear(self.pos_query, w, f"{att}self.pos_query_proj")
            if self.pos_key is not None:
                copy_linear(self.pos_key, w, f"{att}self.pos_key_proj")
            copy_linear(self.attn_out, w, f"{att}output.dense")
            copy_norm(self.attn_norm, w, f"{att}output.LayerNorm")
            copy_linear(self.ffn_in, w, f"{p}intermediate.dense")
            copy_linear(self.ffn_out, w, f"{p}output.dense")
            copy_norm(self.ffn_norm, w, f"{p}output.LayerNorm")


def _refuse_unsupported(cfg: dict) -> None:
    """Config options this port does not implement, refused by name."""
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    if hidden % heads:
        raise ModelLoadError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    if int(cfg.get("conv_kernel_size", 0) or 0) > 0:
        raise ModelLoadError("DeBERTa-v2 with conv_kernel_size > 0 (the first layer's ConvLayer, as in "
                             "deberta-v2-xlarge) is not supported; DeBERTa-v3 models have none")
    checks = (("embedding_size", hidden), ("attention_head_size", hidden // heads), ("pooler_hidden_size", hidden))
    for name, want in checks:
        if cfg.get(name) is not None and int(cfg[name]) != want:
            raise ModelLoadError(f"DeBERTa-v2 with {name} {cfg[name]} (not {want}) is not supported")


class DebertaV2Encoder(nn.Module):
    """Embeddings (word, absolute positions only if position_biased_input,
    token types only if type_vocab_size > 0, then LayerNorm) and the
    disentangled layers."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        cfg = spec.hf_config
        _refuse_unsupported(cfg)
        hidden = int(cfg["hidden_size"])
        eps = float(cfg.get("layer_norm_eps", 1e-7))
        self.rs = RelativeSettings.from_config(cfg)
        self.word = nn.Embedding(int(cfg["vocab_size"]), hidden)
        self.position = nn.Embedding(int(cfg.get("max_position_embeddings", 512)), hidden) \
            if cfg.get("position_biased_input", True) else None
        types = int(cfg.get("type_vocab_size", 0))
        self.token_type = nn.Embedding(types, hidden) if types > 0 else None
        self.sep_id = None
        if types > 1:
            self.sep_id = spec.token_id("sep_token")
            if self.sep_id is None:
                raise ModelLoadError(f"{spec.path}: cannot find the separator token to mark the pair's second segment")
        self.norm = nn.LayerNorm(hidden, eps=eps)
        self.relative = nn.Embedding(2 * self.rs.span, hidden) if self.rs.enabled else None
        # transformers keeps this norm's weights even without relative attention.
        self.relative_norm = nn.LayerNorm(hidden, eps=eps) if self.rs.norm_table else None
        self.layers = nn.ModuleList(DisentangledLayer(cfg, self.rs) for _ in range(int(cfg["num_hidden_layers"])))

    def forward(self, x: StepInputs) -> torch.Tensor:
        h = self.word(x.token_ids)
        if self.position is not None:
            # A graph bucket's filler segment may run past the table; its rows are discarded.
            h = h + self.position(x.positions.long().clamp_max(self.position.num_embeddings - 1))
        if self.token_type is not None:
            types = second_segment(x.token_ids, self.sep_id, x.cu_seqlens, x.seg_ids) \
                if self.sep_id is not None else torch.zeros_like(x.token_ids, dtype=torch.long)
            h = h + self.token_type(types)
        h = self.norm(h)
        step = self.step(x, h.shape[0])
        for layer in self.layers:
            h = layer(h, step)
        return h

    def step(self, x: StepInputs, tokens: int) -> RelativeStep:
        """The padded layout, bucket index and table rows for this step."""
        width = x.plan.max_seqlen
        lay = PaddedLayout(x.cu_seqlens, tokens, width, causal=False)
        if self.relative is None:
            return RelativeStep(lay, torch.zeros((), dtype=torch.long), None)
        lo, hi = self.rs.rows(width)
        slots = torch.arange(width, device=x.cu_seqlens.device)
        span = self.rs.span
        index = (self.rs.bucket(slots.unsqueeze(1) - slots.unsqueeze(0)) + span).clamp(0, 2 * span - 1) - lo
        table = self.relative.weight[lo:hi]
        if self.relative_norm is not None:
            table = self.relative_norm(table)
        return RelativeStep(lay, index, table)

    def load(self, w: WeightReader) -> None:
        with torch.no_grad():
            self.word.weight.copy_(w.take("embeddings.word_embeddings.weight"))
            if self.position is not None:
                self.position.weight.copy_(w.take("embeddings.position_embeddings.weight"))
            if self.token_type is not None:
                self.token_type.weight.copy_(w.take("embeddings.token_type_embeddings.weight"))
            copy_norm(self.norm, w, "embeddings.LayerNorm")
            if self.relative is not None:
                self.relative.weight.copy_(w.take("encoder.rel_embeddings.weight"))
            if self.relative_norm is not None:
                copy_norm(self.relative_norm, w, "encoder.LayerNorm")
        for i, layer in enumerate(cast("list[DisentangledLayer]", self.layers)):  # ModuleList yields nn.Module
            layer.load(w, f"encoder.layer.{i}.")


class DebertaV2CrossEncoder(EmbeddingModel):
    """``DebertaV2ForSequenceClassification``: ContextPooler (first token,
    dense, ``pooler_hidden_act``) and the classifier. One label is a
    ``score`` (the logit and its sigmoid), several ``classify``."""

    pooling = "none"

    def __init__(self, spec: ModelSpec, backend: AttentionBackend):
        super().__init__()
        self.encoder = DebertaV2Encoder(spec)
        act = activation(str(spec.hf_config.get("pooler_hidden_act", "gelu")))
        self.classifier = ClassifierHead(spec.hidden_size, len(spec.labels), act)
        self.kinds = tuple(spec.kinds())
        self.dimension = len(spec.labels)

    def encode(self, x: StepInputs) -> torch.Tensor:
        return self.encoder(x)

    def head(self, kind: OutputKind, hidden: torch.Tensor, x: StepInputs) -> torch.Tensor:
        if kind not in self.kinds:
            return super().head(kind, hidden, x)
        logits = self.classifier(hidden, x)
        return torch.cat([logits, torch.sigmoid(logits)], dim=1) if kind is OutputKind.SCORE else logits

    def load(self, w: WeightReader) -> None:
        self.encoder.load(w)
        self.classifier.load(w, "pooler.dense", "classifier")
