"""What a Hugging Face model directory says about the model: architecture,
the sentence-transformers pipeline (``rose.pipeline``: pooling, Dense,
normalisation, prompts), maximum input length, extra heads, special tokens.
Decided here, once.

Conventions read from the directory:

- ``config.json`` ``architectures`` ending in ``ForSequenceClassification``:
  a cross-encoder: one label is a relevance score (``score``), several
  (``id2label``) a classifier (``classify``: one logit per label).
- ``architectures`` ending in ``ForCausalLM`` without a sentence-transformers
  Pooling (no modules.json, or one with a ``LogitScore``): a causal-LM
  reranker (Qwen3-Reranker), scored as sentence-transformers' CrossEncoder
  does: ``logit(yes) - logit(no)`` at the last token, with ``yes``/``no``
  from LogitScore's config or the tokenizer's vocabulary.
- ``sparse_linear.pt`` / ``colbert_linear.pt`` next to an XLM-RoBERTa model
  (BGE-M3's layout): the sparse lexical-weight head and the multi-vector
  (ColBERT) head.
- Qwen3 decoders: ``"use_bidirectional_attention": true`` (or
  ``"is_causal": false``) in ``config.json`` turns the causal mask off, and
  ``"embedding_quantization": "tanh_int8"`` maps the pooled vector to
  ``round(127 * tanh(x))`` (the pplx-embed-v1 style). Pooling comes from
  sentence-transformers' config as for every model (mean for pplx-embed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ModelLoadError
from .interface import OutputKind
from .st_modules import Pipeline, read_json, read_pipeline, read_prompts

SPARSE_HEAD = "sparse_linear.pt"
COLBERT_HEAD = "colbert_linear.pt"
# Dual encoders (an image tower beside the text tower), by model_type.
DUAL_ENCODERS = ("clip", "siglip")
# Their text pooling, as ModelInfo names it: CLIP's end-of-text token,
# SigLIP's last position.
_DUAL_POOLING = {"clip": "eos", "siglip": "last"}
_TOKEN_ROLES = ("cls_token", "bos_token", "eos_token", "sep_token", "pad_token", "unk_token")


@dataclass
class ModelSpec:
    """The parsed contents of a model directory."""

    path: Path
    model_type: str  # config.json's model_type: "bert", "xlm-roberta", "qwen3", ...
    hf_config: dict[str, Any]
    pipeline: Pipeline | None  # sentence-transformers modules; None for cross-encoders (and null)
    max_length: int  # longest input, special tokens included
    is_cross_encoder: bool
    model_id: str
    # Special-token roles ("cls_token", "sep_token", ...) → ids.
    special_tokens: dict[str, int] = field(default_factory=dict)
    # Causal-LM rerankers: the (true, false) token ids whose logits score.
    score_tokens: tuple[int, int | None] | None = None

    @property
    def pooling(self) -> str:
        """Pooling modes joined by "+" ("cls", "mean", "last", "cls+mean",
        ...); "none" for cross-encoders."""
        return self.pipeline.pooling_name if self.pipeline else "none"

    @property
    def normalize(self) -> bool:
        """Whether the model's own pipeline ends by L2-normalising."""
        return bool(self.pipeline and self.pipeline.normalize)

    @property
    def labels(self) -> tuple[str, ...]:
        """A classifier's label names by index (``id2label``); one unnamed
        label for a relevance scorer; empty for embedders."""
        if not self.is_cross_encoder:
            return ()
        if self.score_tokens is not None:
            return ("score",)
        cfg = self.hf_config
        id2label = cfg.get("id2label") or {}
        count = len(id2label) or int(cfg.get("num_labels", 1))
        try:
            names = {int(k): str(v) for k, v in id2label.items()}
        except ValueError as e:
            raise ModelLoadError(f"{self.path}/config.json: id2label keys must be integers ({e})") from e
        if sorted(names) != list(range(len(names))):
            raise ModelLoadError(f"{self.path}/config.json: id2label must number its labels 0..{count - 1}")
        return tuple(names.get(i, f"LABEL_{i}") for i in range(count))

    @property
    def text_config(self) -> dict[str, Any]:
        """The config of the tower that reads token ids: config.json itself,
        or a dual encoder's ``text_config`` (CLIP, SigLIP)."""
        return text_config(self.hf_config, self.model_type)

    @property
    def vision_config(self) -> dict[str, Any] | None:
        """A dual encoder's ``vision_config``; None for a text-only model."""
        if self.model_type not in DUAL_ENCODERS:
            return None
        vision = self.hf_config.get("vision_config")
        return vision if isinstance(vision, dict) else None

    @property
    def hidden_size(self) -> int:
        return int(self.text_config["hidden_size"])

    @property
    def vocab_size(self) -> int:
        return int(self.text_config["vocab_size"])

    @property
    def sparse_head(self) -> Path | None:
        """BGE-M3's sparse head (``sparse_linear.pt``), when present."""
        p = self.path / SPARSE_HEAD
        return p if p.is_file() and not self.is_cross_encoder else None

    @property
    def colbert_head(self) -> Path | None:
        """BGE-M3's multi-vector head (``colbert_linear.pt``), when present."""
        p = self.path / COLBERT_HEAD
        return p if p.is_file() and not self.is_cross_encoder else None

    @property
    def causal(self) -> bool:
        """Whether attention is causal (decoders, unless the config says
        bidirectional)."""
        if not self.model_type.startswith("qwen"):
            return False
        cfg = self.hf_config
        return not (cfg.get("use_bidirectional_attention") is True or cfg.get("is_causal") is False)

    @property
    def quantization(self) -> str:
        """Post-pooling mapping of dense outputs: "none" or "tanh_int8"."""
        q = str(self.hf_config.get("embedding_quantization") or "none")
        if q not in ("none", "tanh_int8"):
            raise ModelLoadError(f"{self.path}: embedding_quantization {q!r} is not one of none, tanh_int8")
        return q

    def kinds(self) -> list[OutputKind]:
        """The outputs this model directory can produce."""
        if self.is_cross_encoder:
            return [OutputKind.SCORE] if len(self.labels) == 1 else [OutputKind.CLASSIFY]
        if self.pipeline is not None and self.pipeline.splade is not None:
            return [OutputKind.SPARSE_VOCAB]
        kinds = [OutputKind.DENSE]
        if self.sparse_head is not None:
            kinds.append(OutputKind.SPARSE)
        if self.colbert_head is not None:
            kinds.append(OutputKind.MULTI_VECTOR)
        return kinds

    def special_token_ids(self) -> list[int]:
        """Ids of the tokenizer's named special tokens (CLS/BOS, EOS/SEP,
        PAD, UNK): the tokens BGE-M3 gives no lexical weight."""
        return sorted(set(self.special_tokens.values()))

    def token_id(self, role: str) -> int | None:
        """The id of a named special token ("sep_token", "cls_token", ...)."""
        return self.special_tokens.get(role)

    @classmethod
    def from_dir(cls, path: str | Path, model_id: str | None = None) -> "ModelSpec":
        path = Path(path)
        if not path.is_dir():
            raise ModelLoadError(f"model directory {path} does not exist")
        hf = read_json(path / "config.json")
        if not isinstance(hf, dict):
            raise ModelLoadError(f"{path} has no config.json")
        model_type = str(hf.get("model_type", "")).replace("_", "-")
        archs = hf.get("architectures") or []
        is_cross = any(a.endswith("ForSequenceClassification") for a in archs)
        score_tokens = _lm_score_tokens(path) if any(a.endswith("ForCausalLM") for a in archs) else None
        is_cross = is_cross or score_tokens is not None
        return cls(
            path=path,
            model_type=model_type,
            hf_config=hf,
            pipeline=_pipeline(path, model_type, is_cross),
            max_length=_max_length(path, text_config(hf, model_type), model_type),
            is_cross_encoder=is_cross,
            model_id=model_id or path.name,
            special_tokens=_named_token_ids(path, hf),
            score_tokens=score_tokens,
        )


def _pipeline(path: Path, model_type: str, is_cross: bool) -> Pipeline | None:
    """The sentence-transformers pipeline; without modules.json, decoders
    pool the last token and encoders the CLS token, as their own model
    cards do."""
    if is_cross or model_type == "null":
        return None
    if model_type in DUAL_ENCODERS:
        # No sentence-transformers modules: the towers pool and project
        # themselves; their embeddings are compared by cosine, so
        # normalised by default.
        prompts, default_prompt = read_prompts(path)
        return Pipeline((_DUAL_POOLING[model_type],), normalize=True, prompts=prompts,
                        default_prompt_name=default_prompt)
    return read_pipeline(path, "last" if model_type.startswith("qwen") else "cls")


def text_config(hf: dict[str, Any], model_type: str) -> dict[str, Any]:
    """``hf`` itself, or a dual encoder's ``text_config`` (``{}`` when it
    has none: the model family refuses it)."""
    if model_type not in DUAL_ENCODERS:
        return hf
    text = hf.get("text_config")
    return text if isinstance(text, dict) else {}


def _max_length(path: Path, hf: dict[str, Any], model_type: str) -> int:
    """sentence-transformers' max_seq_length, else the tokenizer's
    model_max_length, capped by what the position table holds."""
    positions = int(hf.get("max_position_embeddings", 1 << 30))
    if model_type in ("xlm-roberta", "roberta", "mpnet"):
        # Positions start after the padding index (padding_idx + 1).
        positions -= int(hf.get("pad_token_id", 1)) + 1
    st = read_json(path / "sentence_bert_config.json") or {}
    tok = read_json(path / "tokenizer_config.json") or {}
    for candidate in (st.get("max_seq_length"), tok.get("model_max_length")):
        if isinstance(candidate, (int, float)) and 0 < candidate < 1e6:
            return min(int(candidate), positions)
    return positions


def _lm_score_tokens(path: Path) -> tuple[int, int | None] | None:
    """(true, false) token ids of a causal-LM reranker; None when the
    directory is a causal LM used as an embedder (it has a Pooling)."""
    modules = read_json(path / "modules.json")
    if isinstance(modules, list):
        for m in modules:
            if str(m.get("type", "")).endswith("LogitScore"):
                cfg = read_json(path / str(m.get("path", "")) / "config.json") or {}
                if not isinstance(cfg.get("true_token_id"), int):
                    raise ModelLoadError(f"{path}: LogitScore config has no true_token_id")
                false = cfg.get("false_token_id")
                return int(cfg["true_token_id"]), int(false) if isinstance(false, int) else None
        return None
    vocab = _vocabulary(path)
    if "yes" not in vocab or "no" not in vocab:
        raise ModelLoadError(f"{path}: a causal LM without a sentence-transformers Pooling is served as a reranker, "
                             "which needs 'yes' and 'no' tokens in tokenizer.json")
    return vocab["yes"], vocab["no"]


def _vocabulary(path: Path) -> dict[str, int]:
    """tokenizer.json's tokens → ids, added tokens included."""
    tok = read_json(path / "tokenizer.json") or {}
    by_content: dict[str, int] = {}
    if isinstance(tok, dict):
        vocab = (tok.get("model") or {}).get("vocab")
        if isinstance(vocab, dict):
            by_content.update({k: int(v) for k, v in vocab.items()})
        for t in tok.get("added_tokens") or []:
            by_content[t["content"]] = int(t["id"])
    return by_content


def _named_token_ids(path: Path, hf: dict[str, Any]) -> dict[str, int]:
    """Special-token roles → ids, from tokenizer_config.json's names looked
    up in tokenizer.json, else config.json's ``*_token_id`` fields."""
    tok_cfg = read_json(path / "tokenizer_config.json") or {}
    by_content = _vocabulary(path)
    ids: dict[str, int] = {}
    for role in _TOKEN_ROLES:
        name = tok_cfg.get(role) if isinstance(tok_cfg, dict) else None
        if isinstance(name, dict):  # {"content": "<s>", ...} in older files
            name = name.get("content")
        if isinstance(name, str) and name in by_content:
            ids[role] = by_content[name]
        elif isinstance(hf.get(f"{role}_id"), int):
            ids[role] = int(hf[f"{role}_id"])
    return ids
