"""What a host needs to know about the served model: ``ModelInfo``."""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .config import ModelSpec
from .interface import OutputKind
from .models import EmbeddingModel


@dataclass(frozen=True)
class ModelInfo:
    """What a host needs to know to validate requests and describe the model."""

    model_id: str
    architecture: str
    dimension: int
    max_input_length: int
    vocab_size: int
    pooling: str
    normalize_default: bool
    kinds: tuple[str, ...]
    multi_vector_dimension: int
    dtype: str
    device: str
    # sentence-transformers' prompts (name → text prepended to the input)
    # and the one to apply when a request names none: the host's default
    # templates.
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    # A classifier's label names, one per ``classify`` output value.
    labels: tuple[str, ...] = ()
    # Width of ``token_states`` rows (the hidden size); 0 when the model does
    # not produce them (only embedding models do, SPLADE excepted).
    token_states_dimension: int = 0
    # The model's tokenizer.json and the sha256 of its bytes ("" when the
    # directory has none): what a gateway must tokenize with, and how it
    # can tell that two replicas agree.
    tokenizer_file: str = ""
    tokenizer_sha256: str = ""
    # Causal-LM rerankers: the text a (query, document) pair becomes, with
    # {query} and {document} to fill, tokenized without special tokens
    # ("" = an ordinary pair encoding).
    pair_template: str = ""
    # Every label a step's ``LazyTensor.info.mode`` may carry (one per way
    # this engine's runtimes run a step): a host counts steps by them and
    # refuses a label outside this list.
    step_modes: tuple[str, ...] = ()
    # The pooling a host may apply itself over a span of ``token_states``
    # rows to get what ``dense`` gives for those tokens before normalization
    # (late chunking pools chunk spans so); "" when the dense head does more
    # than pool.
    span_pooling: str = ""
    # LoRA adapters: how many may be loaded at once and the largest rank
    # of one's modules (0, 0: this engine takes none). Which are loaded is
    # ``Engine.adapters()``.
    max_adapters: int = 0
    max_adapter_rank: int = 0
    # Image steps (``Engine.step_images``): the (height, width) of the
    # pixels a model takes, (0, 0) for a model that takes none; the tokens
    # one image costs its vision tower (patches, and CLIP's class token:
    # what a host's token budget counts); the step modes image steps
    # report (also in ``step_modes``).
    image_size: tuple[int, int] = (0, 0)
    image_tokens: int = 0
    image_step_modes: tuple[str, ...] = ()
    # The model's preprocessor_config.json ("" when the directory has none):
    # how a host prepares pixels for ``step_images``.
    preprocessor_file: str = ""
    # Texts a host pads to this many tokens with ``pad_token_id`` before a
    # step (SigLIP was trained on text padded to a fixed length and pools
    # the last position); 0: texts go unpadded.
    text_pad_to: int = 0
    pad_token_id: int = 0

    @property
    def takes_images(self) -> bool:
        """Whether ``Engine.step_images`` serves this model."""
        return self.image_tokens > 0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def of(cls, spec: ModelSpec, model: EmbeddingModel, device: str, dtype: torch.dtype,
           step_modes: tuple[str, ...], max_adapters: int = 0, max_adapter_rank: int = 0,
           image_step_modes: tuple[str, ...] = ()) -> ModelInfo:
        image = model.image_input
        return cls(
            model_id=spec.model_id,
            architecture=spec.model_type,
            dimension=model.dimension,
            max_input_length=spec.max_length,
            vocab_size=spec.vocab_size,
            pooling=spec.pooling,
            normalize_default=spec.normalize,
            kinds=tuple(k.value for k in model.kinds),
            multi_vector_dimension=model.multi_vector_dimension,
            dtype=str(dtype).removeprefix("torch."),
            device=device,
            prompts=dict(spec.pipeline.prompts) if spec.pipeline else {},
            default_prompt_name=spec.pipeline.default_prompt_name if spec.pipeline else None,
            labels=spec.labels if OutputKind.CLASSIFY in model.kinds else (),
            pair_template=getattr(model, "pair_template", ""),
            token_states_dimension=spec.hidden_size if OutputKind.DENSE in model.kinds else 0,
            step_modes=step_modes,
            span_pooling=_span_pooling(spec, model),
            max_adapters=max_adapters,
            max_adapter_rank=max_adapter_rank,
            image_size=(image.height, image.width) if image is not None else (0, 0),
            image_tokens=image.tokens if image is not None else 0,
            image_step_modes=image_step_modes if image is not None else (),
            preprocessor_file=_preprocessor_file(spec.path) if image is not None else "",
            text_pad_to=getattr(model, "text_pad_to", 0),
            pad_token_id=getattr(model, "pad_token_id", 0),
            **_tokenizer_identity(spec.path),
        )


def _span_pooling(spec: ModelSpec, model: EmbeddingModel) -> str:
    """One pooling mode and nothing after it (no Dense projection, no
    quantizing map) over the hidden states ``token_states`` carries."""
    p = spec.pipeline
    if OutputKind.DENSE not in model.kinds or p is None or p.splade is not None or model.image_input is not None:
        return ""
    if len(p.pooling) != 1 or p.steps or spec.quantization != "none":
        return ""
    if model.dimension != spec.hidden_size:
        return ""
    return p.pooling[0]


def _preprocessor_file(path: Path) -> str:
    pre = Path(path) / "preprocessor_config.json"
    return str(pre) if pre.is_file() else ""


def _tokenizer_identity(path: Path) -> dict[str, str]:
    tok = Path(path) / "tokenizer.json"
    if not tok.is_file():
        return {}
    return {"tokenizer_file": str(tok), "tokenizer_sha256": hashlib.sha256(tok.read_bytes()).hexdigest()}
