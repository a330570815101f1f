"""The host-overhead baseline: a plain Python embedding server, one process
(FastAPI + uvicorn with uvloop/httptools), doing what a minimal server does
per request: parse the JSON, tokenize with Hugging Face ``tokenizers``, call
a model that does no work (zeros, like ROSE's null model), render the
OpenAI-shaped response.

    python -m bench.baselines.fastapi_server --tokenizer DIR --port N [--workers W]

With ``--workers`` above 1, uvicorn runs that many processes on one port
(the usual way to use more than one core with a Python server).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from tokenizers import Tokenizer


class EmbeddingRequest(BaseModel):
    input: str | list[str]
    model: str | None = None


class NoOpModel:
    """Takes a flat id tensor and its sequence offsets, returns zeros."""

    def __init__(self, dim: int):
        self.dim = dim

    def __call__(self, ids: torch.Tensor, cu_seqlens: torch.Tensor) -> torch.Tensor:
        return torch.zeros(cu_seqlens.numel() - 1, self.dim)


def build_app(tokenizer_dir: str, dim: int, max_length: int) -> FastAPI:
    tok = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length)
    model = NoOpModel(dim)
    app = FastAPI()

    @app.post("/v1/embeddings")
    async def embeddings(req: EmbeddingRequest) -> dict:
        texts = [req.input] if isinstance(req.input, str) else req.input
        encodings = tok.encode_batch(texts)
        lengths = [len(e.ids) for e in encodings]
        flat = torch.tensor([t for e in encodings for t in e.ids], dtype=torch.int32)
        cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
        torch.cumsum(torch.tensor(lengths, dtype=torch.int32), 0, out=cu[1:])
        vectors = model(flat, cu).tolist()
        tokens = sum(lengths)
        return {
            "object": "list",
            "data": [{"object": "embedding", "index": i, "embedding": v} for i, v in enumerate(vectors)],
            "model": req.model or "null",
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    return app


_SETTINGS = "FASTAPI_BASELINE_SETTINGS"


def app_from_env() -> FastAPI:
    """The app for uvicorn's worker processes (settings in the environment)."""
    s = json.loads(os.environ[_SETTINGS])
    torch.set_num_threads(1)
    return build_app(s["tokenizer"], s["dim"], s["max_length"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokenizer", required=True, help="directory holding tokenizer.json")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--max-length", type=int, default=512)
    p.add_argument("--workers", type=int, default=1, help="server processes")
    a = p.parse_args()
    torch.set_num_threads(1)
    if a.workers > 1:
        os.environ[_SETTINGS] = json.dumps({"tokenizer": a.tokenizer, "dim": a.dim, "max_length": a.max_length})
        uvicorn.run("bench.baselines.fastapi_server:app_from_env", factory=True, workers=a.workers,
                    host="127.0.0.1", port=a.port, log_level="warning", access_log=False)
        return
    uvicorn.run(build_app(a.tokenizer, a.dim, a.max_length), host="127.0.0.1", port=a.port,
                log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
