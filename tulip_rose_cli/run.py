"""One bulk-embedding run: read the input in batches, send the batches not yet
done to Ivy from a few worker threads, store each answer in the work
directory, and assemble the output in input order once every batch is in."""

from __future__ import annotations

import importlib.util
import queue
import sys
import threading
from dataclasses import dataclass
from itertools import islice
from pathlib import Path

from tulip_rose_cli import documents, images, readers, writers
from tulip_rose_cli.batch import KINDS, embed_batch, images_unavailable, late_chunking_unavailable
from tulip_rose_cli.client import ApiError, Ivy, Retry, request_options
from tulip_rose_cli.progress import Progress, retry_line
from tulip_rose_cli.work import Chunk, ResumeRefused, WorkDir

# Exit codes (documented in --help and docs/bulk-embedding.md). BAD_ROWS: the output
# was written but some rows are not in it, so a pipeline that checks only
# the status never takes a short (or empty) file for a complete one.
OK, STRICT_BAD_ROWS, USAGE, SERVER, INTERNAL, BAD_ROWS, INTERRUPTED = 0, 1, 2, 3, 4, 5, 130
DEFAULT_BATCH = 64


class Exit(Exception):
    """Ends the run with ``code`` and a message for the user."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


@dataclass
class Options:
    input: Path
    output: Path
    url: str
    input_format: str | None = None
    column: str | None = None
    id_column: str | None = None
    output_format: str | None = None
    kind: str = "dense"
    batch_size: int | None = None
    concurrency: int | None = None
    prompt_name: str | None = None
    dimensions: int | None = None
    truncate: bool = True
    strict: bool = False
    fresh: bool = False
    overwrite: bool = False
    api_key: str | None = None
    timeout: float = 120.0
    retry_for: float = 600.0
    progress_every: float = 10.0
    # --ray: None runs here; "" on a local Ray cluster; else the cluster's address.
    ray: str | None = None
    # The requests' class; not in the resume manifest: it changes no vector.
    priority: str = "batch"
    # Rows with one value in document_column are one document's chunks.
    late_chunking: bool = False
    document_column: str | None = None
    # A served model or LoRA adapter by name (None: the gateway's default).
    model: str | None = None
    # Every row an image: this column's path, bytes, data URI or URL.
    image_column: str | None = None
    # Base64 image data per request; not in the manifest: it changes no
    # vector and no batch (a batch's images may take several requests).
    image_request_bytes: int = images.DEFAULT_REQUEST_BYTES


def _batches(rows, size: int):
    it = iter(rows)
    while batch := list(islice(it, size)):
        yield batch


class Run:
    def __init__(self, opts: Options, stream=None):
        self.opts = opts
        self.stream = stream or sys.stderr
        self.progress: Progress | None = None
        self.ivy = Ivy(opts.url, opts.api_key, opts.timeout, Retry(give_up_after=opts.retry_for),
                       on_retry=self._on_retry)
        self.stop = threading.Event()
        self.failure: BaseException | None = None
        self.strict_hit = False
        self.dim = 0  # the vector width /info announced (or --dimensions)
        self.most = DEFAULT_BATCH  # the gateway's inputs per request

    def say(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def _on_retry(self, status: int, message: str, delay: float) -> None:
        if self.progress is not None:
            self.progress.retry(status, message, delay)
        else:
            self.say(retry_line(status, message, delay))

    # Set-up: what the server serves decides the batch size, the
    # concurrency and the vector width.

    def _plan(self) -> tuple[str, str, int, int, dict]:
        o = self.opts
        if not o.input.is_file():
            raise Exit(USAGE, f"{o.input}: no such file")
        try:
            in_fmt = readers.detect_format(o.input, o.input_format)
            out_fmt = writers.output_format(o.output, o.output_format)
        except (readers.InputError, ValueError) as e:
            raise Exit(USAGE, str(e)) from None
        if "parquet" in (in_fmt, out_fmt) and importlib.util.find_spec("pyarrow") is None:
            raise Exit(USAGE, "Parquet needs pyarrow: pip install pyarrow (or, in a clone, pip install -e '.[cli]')")
        if o.ray is not None and importlib.util.find_spec("ray") is None:
            raise Exit(USAGE, "--ray needs Ray: pip install 'ray[data]' (or, in a clone, pip install -e '.[ray]')")
        # Every option is checked before anything is written: a mistyped
        # column must not leave a work directory that blocks the fixed rerun.
        if o.late_chunking != bool(o.document_column):
            raise Exit(USAGE, "--late-chunking needs --document-column NAME (the column saying which document "
                              "each row is a chunk of), and --document-column needs --late-chunking")
        if o.late_chunking and o.kind != "dense":
            raise Exit(USAGE, f"--late-chunking makes dense vectors only, not --kind {o.kind}")
        if o.image_column:
            if o.column:
                raise Exit(USAGE, "--image-column makes every row an image: a run reads either --column (texts) "
                                  "or --image-column, not both")
            if o.late_chunking:
                raise Exit(USAGE, "--late-chunking pools the chunks of a text; it takes no --image-column")
            if o.kind != "dense":
                raise Exit(USAGE, f"images have dense embeddings only, not --kind {o.kind}")
        try:
            readers.check(o.input, in_fmt, o.column, o.id_column, o.document_column, o.image_column)
        except readers.InputError as e:
            raise Exit(USAGE, str(e)) from None
        kind = KINDS[o.kind]
        if out_fmt == "npy" and kind != "dense":
            raise Exit(USAGE, f"--kind {o.kind} needs Parquet output (.parquet); .npy holds dense vectors only")
        work = WorkDir(o.output)
        if o.output.exists() and not work.path.exists() and not o.overwrite:
            raise Exit(USAGE, f"{o.output} exists; pass --overwrite to replace it")
        try:
            info = self.ivy.info(o.model)
        except ApiError as e:
            if o.model and e.status == 404:  # Ivy's message names the models it serves
                raise Exit(USAGE, f"--model {o.model!r}: {e.message}") from None
            raise Exit(SERVER, f"cannot get {o.url}/info: {e}") from None
        if kind not in info.get("kinds", [kind]):
            raise Exit(USAGE, f"the model {info.get('model_id')} serves {info.get('kinds')}, not {kind}")
        prompts = info.get("prompts")
        if o.prompt_name and isinstance(prompts, list) and o.prompt_name not in prompts:
            known = ", ".join(map(repr, prompts)) if prompts else "none"
            raise Exit(USAGE, f"--prompt-name {o.prompt_name!r}: the gateway knows no such prompt (its prompts: "
                              f"{known}; the model's own, or those of Ivy's --config [prompts])")
        most = self.most = int(info.get("max_client_batch_size") or DEFAULT_BATCH)
        batch = o.batch_size or min(DEFAULT_BATCH, most)
        if o.late_chunking:
            self._check_late_chunking()
        elif batch > most:  # late chunking sends a document per request, whatever the batch
            raise Exit(USAGE, f"--batch-size {batch} is over the gateway's limit of {most} inputs per request")
        concurrency = o.concurrency or 2 * self._replicas()
        dim = o.dimensions or int(info.get("dimension") or 0)
        manifest = {
            "input": readers.fingerprint(o.input), "input_format": in_fmt,
            # The column actually read (the default named), so a refused
            # resume says "was 'body', now 'text'", not "now None".
            "column": readers.text_column(in_fmt, o.column),
            "id_column": o.id_column, "batch_size": batch, "kind": kind, "prompt_name": o.prompt_name,
            "dimensions": o.dimensions, "truncate": o.truncate, "model_id": info.get("model_id"),
            "dimension": dim,
        }
        if o.late_chunking:  # only then, so runs from before the option still resume
            # The gateway's limit decides which documents are bad, so where batches end.
            manifest.update(late_chunking=True, document_column=o.document_column, max_client_batch_size=most)
        if o.model:  # likewise; an adapter has its base's model_id but its own vectors
            manifest["model"] = o.model
        if o.image_column:  # likewise; the text column is not read
            manifest.update(column=None, image_column=o.image_column)
            self._check_images(info)
        return in_fmt, out_fmt, batch, concurrency, manifest

    def _check_late_chunking(self) -> None:
        why = self._probe("--late-chunking", late_chunking_unavailable)
        if why:
            raise Exit(USAGE, f"--late-chunking: {why}")

    def _check_images(self, info: dict) -> None:
        why = self._probe("--image-column", images_unavailable)
        if why:
            raise Exit(USAGE, f"--image-column: the model {info.get('model_id')} cannot embed images here: {why} "
                              f"(pick an image model, CLIP or SigLIP, with --model, or embed texts with --column)")

    def _probe(self, flag: str, unavailable) -> str | None:
        """Why the gateway cannot do what ``flag`` asks, from one small
        request with the run's options (``unavailable(ivy, options)``)."""
        o = self.opts
        try:
            return unavailable(self.ivy, request_options(o.truncate, o.prompt_name, o.dimensions, o.priority,
                                                         o.model))
        except ApiError as e:
            raise Exit(SERVER, f"cannot try {flag} on {o.url}: {e}") from None

    def _replicas(self) -> int:
        """Healthy replicas behind the gateway (1 when it does not say):
        two requests per replica keep each busy while the next one travels."""
        try:
            ready = self.ivy.get_json("/ready")
            return max(1, int(ready.get("healthy_replicas") or ready.get("replicas") or 1))
        except (ApiError, ValueError):
            return 1

    # One batch.

    def _process(self, k: int, rows: list[readers.Row], work: WorkDir) -> None:
        self.store(k, len(rows), embed_batch(self.ivy, self.opts, self.dim, rows), work)

    def store(self, k: int, n: int, chunk: Chunk, work: WorkDir) -> None:
        """Keeps batch ``k`` (``n`` rows) in the work directory."""
        work.write(k, chunk, KINDS[self.opts.kind], string_ids=bool(self.opts.id_column))
        assert self.progress is not None  # run() makes it before the first batch
        self.progress.add(n, chunk.tokens, len(chunk.errors))
        if chunk.errors and self.opts.strict:
            self.strict_hit = True
            self.stop.set()

    def _worker(self, jobs: queue.Queue[tuple[int, list[readers.Row]] | None], work: WorkDir) -> None:
        while (item := jobs.get()) is not None:
            if self.stop.is_set():
                continue
            try:
                self._process(*item, work)
            except BaseException as e:  # reported by the main thread
                self.failure = self.failure or e
                self.stop.set()

    def _todo(self, work: WorkDir, in_fmt: str, size: int):
        """(k, rows) of each batch not yet in the work directory, in input
        order, until the input ends or the run stops; ``self.chunks`` counts
        the batches seen."""
        o = self.opts
        try:
            rows = readers.rows(o.input, in_fmt, o.column, o.id_column, o.document_column, o.image_column)
            # With late chunking a batch holds whole documents.
            batches = documents.batches(documents.split(rows, self.most), size) if o.late_chunking \
                else _batches(rows, size)
            for k, batch_rows in enumerate(batches):
                if self.stop.is_set():
                    return
                self.chunks = k + 1
                if work.done(k):
                    assert self.progress is not None  # run() makes it before the first batch
                    self.progress.skip(len(batch_rows))
                    continue
                yield k, batch_rows
        except readers.InputError as e:
            self.failure = Exit(USAGE, str(e))
            self.stop.set()

    def _run_threads(self, work: WorkDir, todo, concurrency: int) -> None:
        """The batches sent from ``concurrency`` threads of this process."""
        jobs: queue.Queue[tuple[int, list[readers.Row]] | None] = queue.Queue(maxsize=concurrency)
        threads = [threading.Thread(target=self._worker, args=(jobs, work), daemon=True)
                   for _ in range(concurrency)]
        for t in threads:
            t.start()
        for item in todo:
            while not self.stop.is_set():
                try:
                    jobs.put(item, timeout=0.2)
                    break
                except queue.Full:
                    pass
        for _ in threads:
            jobs.put(None)
        for t in threads:
            while t.is_alive():
                t.join(0.2)

    # The whole run.

    def run(self) -> int:
        o = self.opts
        in_fmt, out_fmt, batch, concurrency, manifest = self._plan()
        self.dim = manifest["dimension"]
        work = WorkDir(o.output)
        try:
            already = work.open(manifest, o.fresh)
        except ResumeRefused as e:
            raise Exit(USAGE, str(e)) from None
        if already:
            self.say(f"resuming: {already} batches of {batch} already in {work.path}")
        self.progress = Progress(readers.count(o.input, in_fmt), every=o.progress_every, stream=self.stream)
        self.chunks = 0
        try:
            if o.ray is not None:
                from tulip_rose_cli.ray import run_batches

                self.say(f"on Ray ({o.ray or 'a local cluster'}): {concurrency} batches in flight")
                run_batches(self, work, self._todo(work, in_fmt, batch), concurrency, o.ray or None)
            else:
                self._run_threads(work, self._todo(work, in_fmt, batch), concurrency)
        except KeyboardInterrupt:
            self.stop.set()
            self.progress.close()
            raise Exit(INTERRUPTED, f"interrupted; finished batches are kept in {work.path}: "
                                    "rerun the same command to continue") from None
        self.progress.close()
        if self.failure is not None:
            if isinstance(self.failure, Exit):
                raise self.failure
            code = SERVER if isinstance(self.failure, ApiError) else INTERNAL
            raise Exit(code, f"stopped: {self.failure}; finished batches are kept in {work.path}: "
                             "rerun the same command to continue") from self.failure
        if self.strict_hit:
            n = writers.write_errors(work, self.chunks, o.output)
            raise Exit(STRICT_BAD_ROWS, f"--strict: stopped at bad rows ({n} so far, listed in "
                                        f"{writers.errors_path(o.output)}); finished batches are kept in "
                                        f"{work.path}")
        chunks = self.chunks
        missing = [k for k in range(chunks) if not work.done(k)]
        if missing:  # cannot happen without a failure above; never assemble a file with holes
            raise Exit(INTERNAL, f"batches {missing[:10]} are missing from {work.path}; rerun to redo them")
        written, bad = writers.assemble(work, chunks, o.output, out_fmt, KINDS[o.kind],
                                        manifest["dimension"], bool(o.id_column))
        work.remove()
        where = f", ids in {writers.ids_path(o.output)}" if out_fmt == "npy" else ""
        self.say(f"{self.progress.line()}\nwrote {written:,} rows to {o.output}{where}")
        if bad:
            raise Exit(BAD_ROWS, f"{bad:,} bad rows were left out of {o.output} (of {written + bad:,}); "
                                 f"each is listed with its reason in {writers.errors_path(o.output)}")
        return OK
