"""Reference outputs computed with ``transformers`` on padded batches (the
way these models are usually run), written out from each model family's
published semantics, to compare ROSE against on the same weights."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F


def _padded(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    return ids, mask


def _unpad(hidden: torch.Tensor, seqs: list[list[int]]) -> list[torch.Tensor]:
    return [hidden[i, : len(s)].float() for i, s in enumerate(seqs)]


def pool(h: torch.Tensor, mode: str) -> torch.Tensor:
    """sentence-transformers pooling of one sequence's hidden states."""
    return {"cls": lambda: h[0], "mean": lambda: h.mean(0), "last": lambda: h[-1]}[mode]()


@torch.inference_mode()
def encoder_hidden(model_dir: Path, seqs: list[list[int]]) -> list[torch.Tensor]:
    """Last hidden states of a BERT / XLM-R ``AutoModel`` (right padding,
    attention mask; XLM-R derives its padding-offset positions itself)."""
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(model_dir), attn_implementation="eager").eval()
    ids, mask = _padded(seqs, int(model.config.pad_token_id or 0))
    return _unpad(model(input_ids=ids, attention_mask=mask).last_hidden_state, seqs)


@torch.inference_mode()
def qwen3_hidden(model_dir: Path, seqs: list[list[int]], bidirectional: bool) -> list[torch.Tensor]:
    """Last hidden states of ``Qwen3Model``: its own causal mask, or for
    bidirectional models a full mask over each sequence's real tokens
    (passed as transformers' per-layer-type mask mapping)."""
    from transformers import Qwen3Model

    model = Qwen3Model.from_pretrained(str(model_dir), attn_implementation="eager").eval()
    ids, mask = _padded(seqs, 0)
    attention = mask
    if bidirectional:
        keys = mask[:, None, None, :].bool().expand(-1, 1, ids.shape[1], -1)
        attention = {"full_attention": torch.zeros(keys.shape).masked_fill(~keys, torch.finfo(torch.float32).min)}
    return _unpad(model(input_ids=ids, attention_mask=attention).last_hidden_state, seqs)


@torch.inference_mode()
def cross_encoder_logits(model_dir: Path, seqs: list[list[int]], token_types: list[list[int]],
                         all_labels: bool = False) -> torch.Tensor:
    """``AutoModelForSequenceClassification`` logits, one per pair (or
    every label's, [n, labels]), with the tokenizer's token type ids."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir), attn_implementation="eager").eval()
    ids, mask = _padded(seqs, int(model.config.pad_token_id or 0))
    types, _ = _padded(token_types, 0)
    kw = {"token_type_ids": types} if getattr(model.config, "type_vocab_size", 1) > 1 else {}
    logits = model(input_ids=ids, attention_mask=mask, **kw).logits.float()
    return logits if all_labels else logits[:, 0]


def st_inputs(st, texts: list[str]) -> list[list[int]]:
    """Token ids of ``texts`` as a SentenceTransformer tokenizes them for
    its own encode (truncated, padding dropped)."""
    feats = st.tokenize(texts)
    return [ids[m.bool()].tolist() for ids, m in zip(feats["input_ids"], feats["attention_mask"])]


def assert_close_vectors(got: torch.Tensor, want: torch.Tensor, min_cosine: float = 0.999) -> None:
    """Same shape, and every row's cosine with its reference >= ``min_cosine``."""
    assert got.shape == want.shape, (got.shape, want.shape)
    cos = F.cosine_similarity(got.double(), want.double(), dim=-1)
    assert cos.min().item() >= min_cosine, f"min cosine {cos.min().item():.6f} at row {cos.argmin().item()}"


def m3_sparse(hidden: torch.Tensor, ids: list[int], head: dict, unused: set[int]) -> dict[int, float]:
    """BGE-M3 lexical weights of one sequence: relu(sparse_linear(h)) per
    token, CLS/EOS/PAD/UNK dropped, the largest weight kept per token id."""
    weights = torch.relu(hidden @ head["weight"].T + head["bias"])[:, 0].tolist()
    out: dict[int, float] = {}
    for w, i in zip(weights, ids):
        if i not in unused and w > 0 and w > out.get(i, 0.0):
            out[i] = w
    return out


def m3_colbert(hidden: torch.Tensor, head: dict) -> torch.Tensor:
    """BGE-M3 multi-vectors of one sequence: colbert_linear over every token
    after the first, L2-normalised."""
    return F.normalize(hidden[1:] @ head["weight"].T + head["bias"], dim=-1)


QWEN3_RERANK_PREFIX = ("<|im_start|>system\nJudge whether the Document meets the requirements based on the Query "
                       "and the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
                       "<|im_start|>user\n")
QWEN3_RERANK_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def qwen3_rerank_ids(model_dir, query: str, docs: list[str]) -> list[list[int]]:
    """Qwen3-Reranker's published prompt around each (query, document)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    texts = [f"{QWEN3_RERANK_PREFIX}<Instruct>: Given a web search query, retrieve relevant passages that answer "
             f"the query\n<Query>: {query}\n<Document>: {d}{QWEN3_RERANK_SUFFIX}" for d in docs]
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def hf_tokenizer(model_dir, max_length: int | None = None):
    """Hugging Face ``tokenizers`` on ``model_dir``'s tokenizer.json, without
    padding; truncating (pairs longest-first) at ``max_length`` when given,
    else not at all: the ids a reference compares with."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    tok.no_padding()
    if max_length:
        tok.enable_truncation(max_length, strategy="longest_first")
    else:
        tok.no_truncation()
    return tok
