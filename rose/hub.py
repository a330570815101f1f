"""Models by name: a Hugging Face Hub id (``org/name``, optionally
``@revision``) resolved to a local snapshot through ``huggingface_hub``,
which owns the cache layout (``HF_HOME`` / ``HF_HUB_CACHE``), offline mode
(``HF_HUB_OFFLINE``), the token (``HF_TOKEN``) and the endpoint
(``HF_ENDPOINT``). Only what serving reads is fetched: configs, tokenizer
files, safetensors weights (``.bin`` only where a folder has no
safetensors), and the sentence-transformers modules' files.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelLoadError

log = logging.getLogger("rose.hub")

# What a served model reads, anywhere in the repository (``*`` crosses
# folders, so module folders' configs and safetensors are included).
SERVING_FILES = [
    "*.json",  # config.json, tokenizer files, sentence-transformers configs
    "*.safetensors",
    "vocab.txt", "merges.txt", "*.model",  # tokenizers' own vocabularies
    "sparse_linear.pt", "colbert_linear.pt",  # BGE-M3's extra heads
]
# Hub ids: "name" or "org/name", then an optional "@revision".
_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*(?:/[\w.-]+)?)(?:@(?P<rev>[\w./-]+))?$")


@dataclass(frozen=True)
class ModelRef:
    """Where a model is: a local directory, or a Hub id at a revision."""

    path: Path | None = None
    repo_id: str | None = None
    revision: str | None = None

    @property
    def name(self) -> str:
        """The id a server reports (the Hub id, or the directory's name)."""
        if self.repo_id:
            return self.repo_id
        assert self.path is not None  # parse() sets one of the two
        return self.path.name


# Files a model directory holds: an argument naming one meant its directory.
_MODEL_FILE_SUFFIXES = (".safetensors", ".json", ".bin", ".pt", ".txt", ".model")


def parse(model: str) -> ModelRef:
    """A directory when one exists at ``model``; else a Hub id, unless
    ``model`` can only be a path (then the error says which path is
    missing: a mistyped local path must not be sent to the Hub)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return ModelRef(path=path)
    if path.is_file():
        raise ModelLoadError(f"{model} is a file; pass the model's directory (the one holding config.json): "
                             f"{path.parent}")
    m = _ID.match(model)
    parent = path.parent
    local_parent = parent != Path(".") and parent.is_dir()
    if model.startswith((".", "/", "~")) or m is None or local_parent or path.suffix in _MODEL_FILE_SUFFIXES:
        hint = ""
        if local_parent:
            folders = sorted(p.name for p in parent.iterdir() if p.is_dir())[:10]
            hint = f"; {parent} exists and holds {', '.join(folders) if folders else 'no folders'}"
        elif m is None or model.startswith((".", "/", "~")):
            hint = " (and it is not a Hub id such as 'org/name' or 'org/name@revision')"
        raise ModelLoadError(f"model directory {model} does not exist{hint}")
    return ModelRef(repo_id=m["repo"], revision=m["rev"])


def resolve(model: str) -> tuple[Path, str]:
    """The local directory of ``model`` (a directory or a Hub id, fetched
    into the cache if needed) and the id to report."""
    ref = parse(model)
    if ref.path is not None:
        return ref.path, ref.name
    try:
        assert ref.repo_id is not None  # parse() sets one of the two
        return download(ref.repo_id, ref.revision), ref.name
    except ModelLoadError as e:
        if "/" not in model:
            raise
        # "models/minilm" reads as a Hub id too: say both readings failed.
        raise ModelLoadError(f"{e}; nor is there a local directory {model} "
                             f"(relative to {Path.cwd()})") from e.__cause__


def download(repo_id: str, revision: str | None = None) -> Path:
    """A snapshot of the files serving needs, from the cache or the Hub."""
    where = f"{repo_id}@{revision or 'main'}"
    # The architecture first: a model ROSE cannot serve is refused before
    # its weights are fetched.
    config = _snapshot(repo_id, revision, ["config.json"], where) / "config.json"
    if config.is_file():
        from .models import config_refusal

        try:
            why = config_refusal(json.loads(config.read_text()))
        except ValueError as e:
            raise ModelLoadError(f"{where}: config.json is not JSON ({e})") from e
        if why:
            raise ModelLoadError(f"{where}: {why}")
    snapshot = _snapshot(repo_id, revision, SERVING_FILES, where)
    if not (snapshot / "config.json").is_file():
        raise ModelLoadError(f"{where}: the repository has no config.json (looked in {snapshot})")
    bins = _bin_patterns(snapshot)
    if bins:
        log.info("%s: fetching PyTorch weights where there are no safetensors: %s", where, ", ".join(bins))
        snapshot = _snapshot(repo_id, revision, SERVING_FILES + bins, where)
    return snapshot


def _bin_patterns(snapshot: Path) -> list[str]:
    """PyTorch ``.bin`` weights to fetch: the model's when it has no
    safetensors, and each module folder's (Dense) likewise."""
    patterns = []
    if not any(snapshot.glob("model*.safetensors")):
        patterns += ["pytorch_model.bin", "pytorch_model*.bin", "pytorch_model.bin.index.json"]
    try:
        modules = json.loads((snapshot / "modules.json").read_text()) if (snapshot / "modules.json").is_file() else []
    except ValueError as e:
        raise ModelLoadError(f"{snapshot / 'modules.json'}: {e}") from e
    for m in modules:
        folder = str(m.get("path", ""))
        if folder and m.get("type", "").endswith("Dense") and not (snapshot / folder / "model.safetensors").is_file():
            patterns.append(f"{folder}/pytorch_model.bin")
    return patterns


def _snapshot(repo_id: str, revision: str | None, patterns: list[str], where: str) -> Path:
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    hint_cache = f"the cache {constants.HF_HUB_CACHE}"
    try:
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns))
    except GatedRepoError as e:
        raise ModelLoadError(f"{where} is gated: accept its terms on the Hub and set HF_TOKEN ({_first_line(e)})") from e
    except RepositoryNotFoundError as e:
        raise ModelLoadError(
            f"model {repo_id} was not found on {constants.ENDPOINT} (a private model needs HF_TOKEN; "
            f"{_first_line(e)})"
        ) from e
    except RevisionNotFoundError as e:
        raise ModelLoadError(f"revision {revision!r} of {repo_id} was not found on {constants.ENDPOINT}") from e
    except LocalEntryNotFoundError as e:
        offline = ("HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE
                   else f"the Hub at {constants.ENDPOINT} could not be reached: {_root_cause(e)}")
        raise ModelLoadError(
            f"{where} is not in {hint_cache} (looked for "
            f"{Path(constants.HF_HUB_CACHE) / ('models--' + repo_id.replace('/', '--'))}) and {offline}"
        ) from e
    except (HfHubHTTPError, OSError) as e:
        raise ModelLoadError(f"cannot fetch {where} from {constants.ENDPOINT}: {_first_line(e)}") from e


def _root_cause(e: BaseException) -> str:
    """The first line of the innermost exception ``e`` was raised from (a
    refused connection, a DNS failure), where the real reason is."""
    seen = {id(e)}
    while (nxt := e.__cause__ or e.__context__) is not None and id(nxt) not in seen:
        seen.add(id(nxt))
        e = nxt
    return _first_line(e)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
