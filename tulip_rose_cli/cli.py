"""``tulip-rose embed``: the command line. Flags with a natural environment
variable (the gateway's URL and key) read it as their default."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

from tulip_rose_cli import images, readers, serve, writers
from tulip_rose_cli.run import BAD_ROWS, DEFAULT_BATCH, INTERNAL, INTERRUPTED, KINDS, Exit, Options, Run

EMBED_HELP = """\
Embed every row of INPUT through a running Ivy gateway and write the vectors
to OUTPUT in input order.

Input (by suffix, or --format): text (.txt, a document per line), JSONL
(.jsonl, the --field), CSV/TSV (.csv/.tsv with a header row, the --column),
Parquet (.parquet, the --column). Ids come from --id-column when given
(kept as strings), else they are the rows' numbers: the n-th data row of
any format has id n, counted from 1 (a CSV/TSV header row is not counted;
for text and JSONL this is the line number).

Output (by suffix, or --output-format): Parquet (columns id and embedding;
id, indices, values for --kind sparse; id, embeddings for --kind
multi-vector) or NumPy .npy (dense only: a float32 matrix, with the ids one
JSON value per line in OUTPUT-stem.ids.jsonl).

Bad rows (empty, not UTF-8, not parseable, or rejected by Ivy, e.g. over the
model's length limit with --no-truncate) are left out of the output and
listed with their row (numbered as the ids are), line (where the row starts
in the file; null for Parquet) and id in OUTPUT.errors.jsonl; the run goes
on unless --strict, and ends with exit code 5. When Ivy rejects a batch, its rows are retried one by one
to find the bad ones.

Resumable: finished batches are kept in OUTPUT.partial/ until the output is
written. After Ctrl-C, a killed process or a gateway outage, rerun the same
command: it continues where it stopped and the output equals a one-shot
run's. A changed input or option is refused (pass --fresh to start over).
Requests that fail with 429, 502, 503, 504, a timeout or no connection are
retried with exponential backoff and jitter while the gateway has been
failing for less than --retry-for seconds: one clock for the whole run,
started by the first failure and stopped by the next success.

Images (--image-column NAME; JSONL, CSV/TSV or Parquet): every row is an
image, embedded by an image model (CLIP, SigLIP) as /v1/embeddings embeds
{"image": ...} items; the text column is not read. A value is a file path
(relative paths start from INPUT's directory), a Parquet binary column's
bytes, a data URI (data:image/png;base64,...) or an http(s) URL (sent as
given: Ivy fetches only from hosts it allows). Files are read by the
worker sending their batch, just before its request. A request holds at
most --batch-size images and --image-request-bytes of base64 (6 MiB,
about 4.5 MiB of files, under Ivy's default --max-body-bytes of 8 MiB): a
batch of larger images takes several requests. A missing or unreadable
file, an image over that bound, or one Ivy refuses (corrupt 422, not an
image type 415, over its --max-image-bytes or --max-image-pixels 413) is a
bad row. Before the run one small PNG is sent: a text-only model is exit 2.

Late chunking (--late-chunking --document-column NAME; JSONL, CSV/TSV or
Parquet): consecutive rows with one value in the NAME column are the chunks
of one document, in order. Each document goes to Ivy in one request
("late_chunking": true: one pass over the whole document, long ones in
windows), and each row still gets its own vector. Batches hold whole
documents (a document longer than --batch-size is a batch of its own). A
document is bad as a whole, every row of it listed in the errors file,
when one of its rows is bad, when it has more chunks than the gateway takes
per request, or when Ivy rejects it (e.g. a chunk with no token of its own).

Each request carries "priority": "batch" (--priority), so a gateway that
separates traffic classes serves interactive queries first, and with
--model NAME "model": NAME: one of the gateway's models or LoRA adapters
(GET /v1/models lists them), which sizes the run (/info?model=NAME).

With --ray [ADDRESS] the batches are sent from tasks on a Ray cluster
(docs/bulk-on-a-cluster.md); everything else above holds unchanged.

Exit codes: 0 done, every row embedded; 1 --strict and a bad row was found;
2 bad usage, unreadable input, an unknown --prompt-name or --model, or a
resume refused; 3 the gateway failed past the retries (or refused the key);
4 an unexpected error; 5 done, but some rows were bad: the output holds the
others and OUTPUT.errors.jsonl lists them; 130 interrupted. After 1, 3, 4
and 130 the finished batches are kept and a rerun continues."""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tulip-rose", description="Serve models with the tulip-rose stack, and use it.")
    sub = p.add_subparsers(dest="command", required=True)
    e = sub.add_parser("embed", help="embed a file of documents through Ivy, resumably",
                       description=EMBED_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("input", type=Path, metavar="INPUT", help="the documents")
    e.add_argument("--out", "-o", type=Path, required=True, metavar="OUTPUT", help="the vectors (.parquet or .npy)")
    e.add_argument("--url", default=os.environ.get("IVY_URL", "http://127.0.0.1:8080"),
                   help="Ivy's HTTP address; the OpenAI clients' base URL (ending in /v1) works too "
                        "(env IVY_URL; default %(default)s)")
    e.add_argument("--api-key", metavar="KEY", default=os.environ.get("IVY_API_KEY"),
                   help="sent as 'Authorization: Bearer KEY' (env IVY_API_KEY)")
    e.add_argument("--model", metavar="NAME", default=os.environ.get("IVY_MODEL"),
                   help="the served model or LoRA adapter to embed with, by the name /v1/models lists (env "
                        "IVY_MODEL; default: the gateway's default model); checked before the run starts")
    g = e.add_argument_group("input")
    g.add_argument("--format", dest="input_format", choices=readers.FORMATS, help="input format (default: by suffix)")
    g.add_argument("--field", "--column", dest="column", metavar="NAME",
                   help=f"the text's JSONL field or CSV/TSV/Parquet column (default: {readers.DEFAULT_COLUMN})")
    g.add_argument("--image-column", "--image-field", dest="image_column", metavar="NAME",
                   help="embed images instead of texts: the column (JSONL field) holding each row's image file "
                        "path (relative to INPUT's directory), bytes (Parquet binary), data URI or URL; needs an "
                        "image model (CLIP, SigLIP)")
    g.add_argument("--id-field", "--id-column", dest="id_column", metavar="NAME",
                   help="the ids' field or column (default: the rows' numbers, from 1, header not counted)")
    g = e.add_argument_group("output")
    g.add_argument("--output-format", choices=writers.OUTPUT_FORMATS, help="output format (default: by suffix)")
    g.add_argument("--kind", choices=list(KINDS), default="dense",
                   help="dense vectors (/v1/embeddings), sparse (/embed_sparse) or multi-vector (/embed_all); "
                        "default %(default)s")
    g.add_argument("--overwrite", action="store_true", help="replace an existing OUTPUT")
    g = e.add_argument_group("embedding")
    g.add_argument("--prompt-name", metavar="NAME",
                   help="a prompt template the gateway knows (its /info lists them under prompts; checked "
                        "before the run starts)")
    g.add_argument("--dimensions", type=int, metavar="N", help="Matryoshka: keep the first N dimensions, renormalised")
    g.add_argument("--truncate", action=argparse.BooleanOptionalAction, default=True,
                   help="cut inputs over the model's length limit (default); with --no-truncate they are bad rows")
    g.add_argument("--late-chunking", action="store_true",
                   help="embed each document's chunks in one pass over the document (needs --document-column; "
                        "dense only)")
    g.add_argument("--document-column", "--document-field", dest="document_column", metavar="NAME",
                   help="with --late-chunking: the column (JSONL field) whose value says which document a row "
                        "is a chunk of; consecutive rows with one value are one document, in order")
    g.add_argument("--priority", choices=["batch", "interactive"], default="batch",
                   help="the requests' priority class: batch (default) yields to interactive queries on the "
                        "same replicas; interactive competes with them")
    g = e.add_argument_group("running")
    g.add_argument("--batch-size", type=int, metavar="N",
                   help=f"documents per request and per resumable batch (default {DEFAULT_BATCH}, or the "
                        "gateway's limit if lower)")
    g.add_argument("--image-request-bytes", type=int, metavar="N", default=images.DEFAULT_REQUEST_BYTES,
                   help="with --image-column: most bytes of base64 image data in one request (default "
                        "%(default)s, 6 MiB: under Ivy's default --max-body-bytes of 8 MiB); a larger image is a "
                        "bad row")
    g.add_argument("--concurrency", type=int, metavar="N",
                   help="requests in flight (default: 2 per healthy replica, from the gateway's /ready)")
    g.add_argument("--timeout", type=float, metavar="S", default=120.0, help="seconds per HTTP request (default %(default)s)")
    g.add_argument("--retry-for", type=float, metavar="S", default=600.0,
                   help="seconds the gateway may keep failing before the run stops: one budget for the "
                        "whole run, reset by each success (default %(default)s)")
    g.add_argument("--strict", action="store_true",
                   help="stop at the first bad row, exit code 1 (without it, bad rows end the run with exit "
                        f"code {BAD_ROWS})")
    g.add_argument("--fresh", action="store_true", help="discard a previous run's OUTPUT.partial/ and start over")
    g.add_argument("--progress-every", type=float, metavar="S", default=10.0,
                   help="seconds between progress lines when stderr is not a terminal (default %(default)s)")
    g.add_argument("--ray", nargs="?", const="", default=None, metavar="ADDRESS",
                   help="send the batches from tasks on a Ray cluster: ADDRESS (ray://..., host:port, auto), "
                        "else RAY_ADDRESS, else a local cluster; the output, the resume and the bad rows are "
                        "the same as without it (needs Ray: pip install -e '.[ray]' in a clone; put INPUT before "
                        "a bare --ray)")
    serve.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "serve":
        return serve.run(args)
    for name in ("batch_size", "concurrency", "dimensions", "image_request_bytes"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser().error(f"--{name.replace('_', '-')} must be at least 1")
    opts = Options(input=args.input, output=args.out, url=args.url, input_format=args.input_format,
                   column=args.column, id_column=args.id_column, output_format=args.output_format,
                   kind=args.kind, batch_size=args.batch_size, concurrency=args.concurrency,
                   prompt_name=args.prompt_name, dimensions=args.dimensions, truncate=args.truncate,
                   strict=args.strict, fresh=args.fresh, overwrite=args.overwrite, api_key=args.api_key,
                   timeout=args.timeout, retry_for=args.retry_for, progress_every=args.progress_every,
                   ray=args.ray, priority=args.priority, late_chunking=args.late_chunking,
                   document_column=args.document_column, model=args.model, image_column=args.image_column,
                   image_request_bytes=args.image_request_bytes)
    try:
        return Run(opts).run()
    except KeyboardInterrupt:  # before the batches start, or while assembling
        print("tulip-rose embed: interrupted; rerun the same command to continue", file=sys.stderr)
        return INTERRUPTED
    except Exit as e:
        if e.code == INTERNAL and e.__cause__ is not None:
            traceback.print_exception(e.__cause__, file=sys.stderr)
        print(f"tulip-rose embed: {e}", file=sys.stderr)
        return e.code
