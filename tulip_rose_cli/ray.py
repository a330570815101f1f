"""Bulk embedding on a Ray cluster (the ``ray`` extra: ``pip install -e '.[ray]'`` in a clone).

Two Ray Data callable classes for ``Dataset.map_batches``, one per shape of
cluster:

- ``IvyEmbedder``: the actors send their batches to a serving tier (Ivy) at
  the ``batch`` priority class, with ``tulip-rose embed``'s client (its
  retries, backoff and Retry-After, and its search for the bad rows of a
  rejected request);
- ``RoseEmbedder``: the actors run the ROSE engine themselves (a GPU
  cluster with no serving tier; ``num_gpus=1`` per actor), tokenizing with
  the model's ``tokenizer.json`` and its prompts as Ivy does, so a row equals
  what Ivy answers for the same text.

Both add the output columns to the batch and pass every other column
through: ``embedding`` (a fixed-size list of float32) for dense;
``indices`` (list of int32 token ids) and ``values`` (list of float32) for
sparse; ``embeddings`` (a list of fixed-size float32 vectors) for
multi-vector; and ``error``, null for good rows and the reason for a bad
one (whose outputs are null). With ``strict=True`` the first bad row fails
the task instead, naming the row.

With ``late_chunking=True`` and ``document_column`` (dense only), the
consecutive rows of a batch with one value in ``document_column`` are the
chunks of one document, embedded from one pass over the document
(docs/api.md, "Late chunking"): one Ivy request per document, or the
engine's token states pooled over each chunk's span in the actor. The
chunks go in the order of ``position_column`` where given, else in the
batch's order. A batch must hold whole documents, which ``map_batches``
does not promise (it cuts batches by size), and Ray's groupby does not
keep a group's rows in dataset order (a hash shuffle): so
``ds.groupby(document_column).map_groups(...)`` with a ``position_column``,
every call one whole document, its chunks put in order here. A document
with a bad row, or one refused, is bad as a whole.

``run_batches`` is the ``--ray`` engine of ``tulip-rose embed``: the same
batches as the single-machine run, sent from Ray tasks, stored in the same
resumable work directory by the driver, so the output file is the same.
"""

from __future__ import annotations

import abc
import logging
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import numpy as np

from tulip_rose_cli import documents, readers, writers
from tulip_rose_cli import late_chunking as chunking
from tulip_rose_cli.batch import late_chunking_unavailable
from tulip_rose_cli.client import ApiError, Ivy, Rejected, Retry, request_options

if TYPE_CHECKING:
    import pyarrow as pa

# Output kinds by the names the command line uses, and the engine's names.
_KINDS = {"dense": "dense", "sparse": "sparse", "multi-vector": "multi_vector", "multi_vector": "multi_vector"}


class BadRow(ValueError):
    """A row that cannot be embedded, in strict mode."""


def _kind(kind: str) -> str:
    try:
        return _KINDS[kind]
    except KeyError:
        raise ValueError(f"kind {kind!r} is not one of dense, sparse, multi-vector") from None


def _table(batch):
    """A Ray Data batch (a pyarrow Table, a pandas DataFrame, or a dict of
    NumPy arrays) as a pyarrow Table."""
    import pyarrow as pa

    if isinstance(batch, pa.Table):
        return batch
    if isinstance(batch, dict):
        cols = {}
        for name, col in batch.items():
            col = np.asarray(col)
            if col.ndim > 1:  # a tensor column: one fixed-size list per row
                flat = pa.array(col.reshape(len(col), -1).reshape(-1))
                cols[name] = pa.FixedSizeListArray.from_arrays(flat, int(np.prod(col.shape[1:])))
            else:
                cols[name] = pa.array(col.tolist())
        return pa.table(cols)
    if hasattr(batch, "to_dict") and hasattr(batch, "columns"):  # pandas
        return pa.Table.from_pandas(batch, preserve_index=False)
    raise TypeError(f"cannot read a batch of type {type(batch).__name__}")


def _with_outputs(table, kind: str, outputs: list, reasons: list, dim: int, error_column: str):
    """``table`` with the output columns and the error column set (replaced
    when the input had columns of those names)."""
    import pyarrow as pa

    for name, col in [*writers.columns(kind, outputs, dim).items(),
                      (error_column, pa.array(reasons, type=pa.string()))]:
        if name in table.column_names:
            table = table.drop_columns([name])
        table = table.append_column(name, col)
    return table


def _row_name(table, i: int, id_column: str | None, text) -> str:
    if id_column and id_column in table.column_names:
        return f"the row with {id_column} {table.column(id_column)[i].as_py()!r}"
    snippet = text if not isinstance(text, str) or len(text) <= 60 else text[:57] + "..."
    return f"row {i} of its batch (text {snippet!r})"


def _texts(table, column: str) -> tuple[list, list]:
    """The column's values and, per row, why it cannot be embedded (None:
    it can)."""
    if column not in table.column_names:
        raise KeyError(f"the batch has no column {column!r}; its columns are {table.column_names}")
    texts = table.column(column).to_pylist()
    reasons: list[str | None] = []
    for t in texts:
        if t is None:
            reasons.append("empty")
        elif not isinstance(t, str):
            reasons.append(f"column {column!r} is not a string")
        else:
            reasons.append(readers.check_text(t))
    return texts, reasons


class _Embedder(abc.ABC):
    """What both shapes share: reading the batch, the error column, strict
    mode."""

    kind: str
    dim: int

    def __init__(self, kind: str, column: str, strict: bool, id_column: str | None, error_column: str,
                 late_chunking: bool = False, document_column: str | None = None,
                 position_column: str | None = None):
        self.kind = _kind(kind)
        self.column = column
        self.strict = strict
        self.id_column = id_column
        self.error_column = error_column
        if late_chunking != bool(document_column):
            raise ValueError("late_chunking needs document_column (the column saying which document each row is "
                             "a chunk of), and document_column needs late_chunking")
        if position_column and not document_column:
            raise ValueError("position_column orders a document's chunks: it needs late_chunking and document_column")
        if late_chunking and self.kind != "dense":
            raise ValueError(f"late chunking makes dense vectors only, not {kind}")
        self.document_column = document_column
        self.position_column = position_column

    @abc.abstractmethod
    def _embed(self, texts: list[str]) -> tuple[list, dict[int, str]]:
        """Outputs of ``texts`` (None where a text is bad) and the reasons:
        through Ivy (IvyEmbedder) or the engine in the actor (RoseEmbedder)."""

    @abc.abstractmethod
    def _late(self, docs: list[list[str]]) -> list[tuple[np.ndarray | None, str | None]]:
        """Each document's chunk vectors, or why it has none."""

    def __call__(self, batch) -> pa.Table:
        table = _table(batch)
        texts, reasons = _texts(table, self.column)
        good = [i for i, r in enumerate(reasons) if r is None]
        outputs: list = [None] * len(texts)
        if self.document_column:
            self._late_rows(table, texts, reasons, outputs)
        elif good:
            got, rejected = self._embed([texts[i] for i in good])
            for j, i in enumerate(good):
                outputs[i] = got[j]
                if j in rejected:
                    reasons[i] = rejected[j]
        if self.strict:
            for i, r in enumerate(reasons):
                if r is not None:
                    raise BadRow(f"{_row_name(table, i, self.id_column, texts[i])}: {r}")
        return _with_outputs(table, self.kind, outputs, reasons, self.dim, self.error_column)

    def _late_rows(self, table, texts: list, reasons: list, outputs: list) -> None:
        """Late chunking: fills ``outputs`` and ``reasons`` document by
        document (the rules of ``tulip-rose embed --late-chunking``)."""
        for name in filter(None, (self.document_column, self.position_column)):
            if name not in table.column_names:
                raise KeyError(f"the batch has no column {name!r}; its columns are {table.column_names}")
        keys = table.column(self.document_column).to_pylist()
        places = table.column(self.position_column).to_pylist() if self.position_column else [0] * len(keys)
        rows = []
        for i, (text, why, key, place) in enumerate(zip(texts, reasons, keys, places)):
            why = why or ("no document value" if key is None else "no position" if place is None else None)
            rows.append(readers.Row(i, None, None, None if why else text, why, key))
        sent = []
        for doc in documents.split(rows):
            bad = next((r for r in doc if r.bad is not None), None)
            if bad is None:
                # The chunks in their positions' order (sorted() is stable).
                sent.append(sorted(doc, key=lambda r: places[r.index]))
                continue
            for r in doc:
                reasons[r.index] = r.bad or f"its document has a bad row (row {bad.index} of its batch: {bad.bad})"
        for doc, (vectors, why) in zip(sent, self._late([[r.text or "" for r in doc] for doc in sent])):
            for j, r in enumerate(doc):
                if vectors is None:
                    reasons[r.index] = why
                else:
                    outputs[r.index] = vectors[j]


class IvyEmbedder(_Embedder):
    """``ds.map_batches(IvyEmbedder, fn_constructor_kwargs={"url": ...},
    compute=ray.data.ActorPoolStrategy(size=N), num_cpus=0.5,
    batch_size=B)`` (``concurrency=N`` before Ray 2.51): each actor sends
    its batches to Ivy's HTTP API at the ``batch`` priority class (``priority``), ``requests_in_flight``
    requests of up to ``request_size`` texts at a time (default: Ivy's
    ``max_client_batch_size``, at most 64), retrying 429/502/503/504,
    timeouts and refused connections with backoff (and Retry-After) for up
    to ``retry_for`` seconds, as ``tulip-rose embed`` does. A request Ivy
    rejects (400/413/415/422) is retried one text at a time to find the bad
    rows. ``api_key`` defaults to ``IVY_API_KEY``; ``model`` picks one of
    the gateway's models or LoRA adapters (default: its default model),
    refused here when the gateway serves no such model. With ``late_chunking``
    each document is one request (``requests_in_flight`` documents at a
    time); a gateway that cannot late-chunk is refused here, before the
    first batch."""

    def __init__(self, url: str, *, kind: str = "dense", column: str = "text", api_key: str | None = None,
                 prompt_name: str | None = None, dimensions: int | None = None, truncate: bool = True,
                 strict: bool = False, id_column: str | None = None, error_column: str = "error",
                 request_size: int | None = None, requests_in_flight: int = 2, timeout: float = 120.0,
                 retry_for: float = 600.0, priority: str = "batch", late_chunking: bool = False,
                 document_column: str | None = None, position_column: str | None = None,
                 model: str | None = None):
        super().__init__(kind, column, strict, id_column, error_column, late_chunking, document_column,
                         position_column)
        api_key = api_key if api_key is not None else os.environ.get("IVY_API_KEY")
        self.ivy = Ivy(url, api_key, timeout, Retry(give_up_after=retry_for))
        try:
            info = self.ivy.info(model)
        except ApiError as e:
            if model and e.status == 404:  # Ivy's message names the models it serves
                raise ValueError(f"model {model!r}: {e.message}") from None
            raise
        if self.kind not in info.get("kinds", [self.kind]):
            raise ValueError(f"the model {info.get('model_id')} serves {info.get('kinds')}, not {self.kind}")
        most = self.most = int(info.get("max_client_batch_size") or 64)
        self.request_size = min(request_size or 64, most)
        self.dim = int(dimensions or info.get("dimension") or 0)
        self.options = request_options(truncate, prompt_name, dimensions, priority, model)
        if self.kind == "multi_vector":
            # /info gives the dense width only: the token vectors' width is
            # what one answer has (every block's column must have one type).
            self.dim = int(self.ivy.embed(self.kind, ["width"], self.options).rows[0].shape[1])
        if late_chunking and (why := late_chunking_unavailable(self.ivy, self.options)):
            raise ValueError(f"late_chunking: {why}")
        self.pool = ThreadPoolExecutor(max(1, requests_in_flight))

    def _embed(self, texts: list[str]) -> tuple[list, dict[int, str]]:
        starts = range(0, len(texts), self.request_size)
        parts = list(self.pool.map(
            lambda s: self.ivy.embed_rows(self.kind, texts[s:s + self.request_size], self.options), starts))
        outputs, errors = [], {}
        for s, (rows, bad, _) in zip(starts, parts):
            outputs.extend(rows)
            errors.update({s + j: reason for j, reason in bad.items()})
        return outputs, errors

    def _late(self, docs: list[list[str]]) -> list[tuple[np.ndarray | None, str | None]]:
        body = {**self.options, "late_chunking": True}

        def one(chunks: list[str]) -> tuple[np.ndarray | None, str | None]:
            if len(chunks) > self.most:
                return None, (f"its document has more than {self.most} chunks, the gateway's limit of inputs per "
                              "request (max_client_batch_size): split it into smaller documents")
            try:
                return np.stack(self.ivy.embed("dense", chunks, body).rows), None
            except Rejected as e:
                return None, f"its document was rejected by Ivy (HTTP {e.status}): {e.message}"

        return list(self.pool.map(one, docs))


class RoseEmbedder(_Embedder):
    """``ds.map_batches(RoseEmbedder, fn_constructor_kwargs={"model": ...},
    compute=ray.data.ActorPoolStrategy(size=N), num_gpus=1, batch_size=B)``:
    each actor loads the model
    once (a directory or a Hub id, as ``tulip --model`` takes), then embeds
    its batches in steps of at most ``token_budget`` tokens. Texts are
    tokenized with the model's ``tokenizer.json`` after its prompt (the
    named one, else the model's default), truncated to the model's limit
    (or, with ``truncate=False``, refused with the message Ivy gives), and
    the outputs are made as Tulip makes them: so each row equals Ivy's
    answer for the same text on the same model, device and dtype. With
    ``late_chunking`` the engine's token states are pooled over each
    chunk's span here, to Ivy's rule (``late_chunking.py``); a model whose
    head does more than pool is refused, as Ivy refuses it."""

    def __init__(self, model: str, *, kind: str = "dense", column: str = "text", prompt_name: str | None = None,
                 dimensions: int | None = None, truncate: bool = True, strict: bool = False,
                 id_column: str | None = None, error_column: str = "error", token_budget: int = 4096,
                 device: str = "auto", dtype: str = "auto", threads: int | None = None,
                 cpu_bf16: bool | None = None, late_chunking: bool = False, document_column: str | None = None,
                 position_column: str | None = None):
        super().__init__(kind, column, strict, id_column, error_column, late_chunking, document_column,
                         position_column)
        import torch
        from tokenizers import Tokenizer

        from rose import Engine
        from rose.cpu import Bf16Settings
        from rose.hub import resolve

        if threads:
            torch.set_num_threads(threads)
        path, name = resolve(model)
        # cpu_bf16 as Tulip's --cpu-bf16 (None = auto: a CPU with AMX runs
        # gated steps on the model's bfloat16 twin, docs/latency.md).
        runtimes = [] if cpu_bf16 is False else [Bf16Settings(require_amx=cpu_bf16 is None)]
        self.engine = Engine.from_dir(path, device=device, dtype=dtype, model_id=name, cpu_runtimes=runtimes)
        info = self.engine.info
        if self.kind not in info.kinds:
            raise ValueError(f"the model {info.model_id} produces {', '.join(info.kinds)}, not {self.kind}")
        if not info.tokenizer_file:
            raise ValueError(f"{path} has no tokenizer.json: Ivy could not serve it either")
        if dimensions is not None and not 0 < dimensions <= info.dimension:
            raise ValueError(f"dimensions must be in [1, {info.dimension}], not {dimensions}")
        prompt = prompt_name or info.default_prompt_name
        if prompt is not None and prompt not in info.prompts:
            raise ValueError(f"prompt_name {prompt!r} is unknown; the model's prompts: {sorted(info.prompts)}")
        self.prefix = info.prompts[prompt] if prompt is not None else ""
        # Two copies of the tokenizer: one that truncates as Ivy does (right
        # side, special tokens kept), one that does not, to count the tokens
        # of an input it must refuse.
        self.tokenizer = Tokenizer.from_file(info.tokenizer_file)
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(info.max_input_length)
        self.whole = Tokenizer.from_file(info.tokenizer_file)
        self.whole.no_padding()
        self.whole.no_truncation()
        self.max_length = info.max_input_length
        self.truncate = truncate
        self.token_budget = max(token_budget, self.max_length)
        self.dimensions = dimensions
        self.dim = (dimensions or info.dimension) if self.kind == "dense" else info.multi_vector_dimension
        self.span_pooling = chunking.MODES.get(info.span_pooling) if info.token_states_dimension else None
        if self.document_column and self.span_pooling is None:
            raise ValueError(f"the model {info.model_id} cannot be late-chunked: its vectors are not a pooling of "
                             "its token states alone (its head projects or quantizes after pooling)")
        self.normalize = info.normalize_default
        self.lock = threading.Lock()  # the engine runs one step at a time

    def _ids(self, text: str) -> tuple[list[int] | None, str | None]:
        if self.truncate:
            return self.tokenizer.encode(self.prefix + text).ids, None
        ids = self.whole.encode(self.prefix + text).ids
        if len(ids) <= self.max_length:
            return ids, None
        # Ivy's own words (ivy/src/pipeline/encode.rs), so both shapes report alike.
        return None, (f"rejected: the input has {len(ids)} tokens but the model accepts at most "
                      f"{self.max_length}; shorten it or allow truncation")

    def _embed(self, texts: list[str]) -> tuple[list, dict[int, str]]:
        outputs: list = [None] * len(texts)
        errors: dict[int, str] = {}
        steps: list[list[tuple[int, list[int]]]] = []
        step: list[tuple[int, list[int]]] = []
        tokens = 0
        for i, text in enumerate(texts):
            ids, bad = self._ids(text)
            if bad:
                errors[i] = bad
                continue
            assert ids is not None  # _ids gives the ids or why there are none
            if step and tokens + len(ids) > self.token_budget:
                steps.append(step)
                step, tokens = [], 0
            step.append((i, ids))
            tokens += len(ids)
        if step:
            steps.append(step)
        with self.lock:
            for step in steps:
                for (i, _), out in zip(step, self._step([ids for _, ids in step])):
                    outputs[i] = out
        return outputs, errors

    def _late(self, docs: list[list[str]]) -> list[tuple[np.ndarray | None, str | None]]:
        plans: list = []
        for chunks in docs:
            try:
                plans.append(chunking.plan(self.whole, self.prefix, chunks, self.max_length))
            except ValueError as e:  # Ivy answers these with 422
                plans.append(f"its document was refused: {e}")
        states = self._states([s for p in plans if not isinstance(p, str) for s in p.sequences])
        out: list[tuple[np.ndarray | None, str | None]] = []
        for p in plans:
            if isinstance(p, str):
                out.append((None, p))
                continue
            assert self.span_pooling is not None  # __init__ refuses late chunking without it
            out.append((chunking.pool(p, states[:len(p.sequences)], self.span_pooling, self.dim,
                                           self.normalize), None))
            states = states[len(p.sequences):]
        return out

    def _states(self, seqs: list[list[int]]) -> list[np.ndarray]:
        """Each sequence's token states ([len, hidden]), in steps of at
        most ``token_budget`` tokens."""
        out: list[np.ndarray] = []
        with self.lock:
            start = 0
            while start < len(seqs):
                end, tokens = start + 1, len(seqs[start])
                while end < len(seqs) and tokens + len(seqs[end]) <= self.token_budget:
                    tokens += len(seqs[end])
                    end += 1
                flat = self.engine.embed(seqs[start:end], "token_states").float().numpy()
                out += np.split(flat, np.cumsum([len(s) for s in seqs[start:end - 1]]))
                start = end
        return out

    def _step(self, seqs: list[list[int]]) -> list:
        """One engine step's outputs per sequence, shaped as Tulip shapes
        them (tulip/src/output.rs)."""
        options = {"dimensions": [self.dimensions or 0] * len(seqs)} if self.kind == "dense" else {}
        rows = self.engine.embed(seqs, self.kind, **options).float().numpy()
        if self.kind == "dense":
            return list(rows[:, :self.dim].astype(np.float32, copy=True))
        out, at = [], 0
        for ids in seqs:
            n = len(ids) if self.kind == "sparse" else len(ids) - 1
            part = rows[at:at + n]
            at += n
            out.append(sparse_weights(ids, part[:, 0]) if self.kind == "sparse"
                       else np.ascontiguousarray(part[:, :self.dim], dtype=np.float32))
        return out


def sparse_weights(ids: list[int], weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lexical weights as Tulip reports them: the largest weight of each
    token id, positive weights only, sorted by id."""
    best: dict[int, float] = {}
    for t, w in zip(ids, weights.tolist()):
        if w > 0.0 and w > best.get(t, 0.0):
            best[t] = w
    keys = sorted(best)
    return np.asarray(keys, dtype=np.int32), np.asarray([best[k] for k in keys], dtype=np.float32)


# ``tulip-rose embed --ray``: the command's batches as Ray tasks.

_CLIENTS: dict = {}


def _client(opts) -> Ivy:
    """One Ivy client per worker process and gateway (keep-alive
    connections outlive a task)."""
    from tulip_rose_cli.progress import retry_line

    key = (opts.url, opts.api_key, opts.timeout, opts.retry_for)
    if key not in _CLIENTS:
        # A retry is said on the worker's stderr, which Ray shows on the driver's.
        _CLIENTS[key] = Ivy(opts.url, opts.api_key, opts.timeout, Retry(give_up_after=opts.retry_for),
                            on_retry=lambda *a: print(retry_line(*a), file=sys.stderr, flush=True))
    return _CLIENTS[key]


def _embed_task(opts, dim: int, rows: list):
    from tulip_rose_cli.batch import embed_batch

    return embed_batch(_client(opts), opts, dim, rows)


def run_batches(run, work, todo, concurrency: int, address: str | None) -> None:
    """Sends ``todo``'s batches ((k, rows), in input order) to Ray tasks,
    ``concurrency`` at a time, and stores each answer through ``run`` (the
    ``Run`` of ``tulip-rose embed``) as the answers come: the work directory,
    the resume and the assembly in input order are the single-machine run's.
    A task whose worker dies is retried by Ray; a failure (Ivy down past
    ``--retry-for``) stops the run as it does on one machine."""
    import ray

    if not ray.is_initialized():
        # No address: RAY_ADDRESS if set, else a local cluster.
        ray.init(address=address, logging_level=logging.WARNING, configure_logging=False,
                 include_dashboard=None if address else False)  # None: Ray's default
    # Sending is I/O: a fraction of a CPU per task lets `concurrency` of
    # them run on a small cluster. Worker deaths are retried (max_retries);
    # Ivy's answers are not exceptions Ray retries.
    task = ray.remote(num_cpus=0.25, max_retries=5)(_embed_task)
    pending: dict = {}

    def collect(most: int) -> None:
        """Stores finished batches until at most ``most`` are in flight."""
        while len(pending) > most:
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
            for ref in ready:
                k, n = pending.pop(ref)
                try:
                    chunk = ray.get(ref)
                except ray.exceptions.RayTaskError as e:
                    run.failure = run.failure or getattr(e, "cause", None) or e
                    run.stop.set()
                    continue
                except ray.exceptions.RayError as e:  # a task lost past its retries
                    run.failure = run.failure or e
                    run.stop.set()
                    continue
                run.store(k, n, chunk, work)

    try:
        for k, rows in todo:
            collect(concurrency - 1)
            if run.stop.is_set():
                break
            pending[task.remote(run.opts, run.dim, rows)] = (k, len(rows))
        collect(0)
    finally:
        for ref in pending:  # interrupted: what is still running is redone by a rerun
            ray.cancel(ref)
