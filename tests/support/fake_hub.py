"""The Hugging Face Hub without the internet, for tests of models by name:

- ``hub_cache`` lays a model directory out in a cache exactly as
  ``huggingface_hub`` does (``models--org--name/blobs/<etag>``,
  ``snapshots/<commit>/<file>`` as relative symlinks to the blobs,
  ``refs/<branch>`` holding the commit);
- ``FakeHub`` is a local HTTP server speaking the parts of the Hub's API that
  ``snapshot_download`` calls (read from huggingface_hub's source):
  ``GET /api/models/{id}/revision/{rev}`` (repo info: the commit ``sha``),
  ``GET /api/models/{id}/tree/{commit}?recursive=...`` (the file listing),
  and ``HEAD``/``GET /{id}/resolve/{rev}/{file}`` with the metadata headers
  (``X-Repo-Commit``, ``ETag``, ``Content-Length``); errors carry the
  Hub's ``X-Error-Code`` (RepoNotFound, RevisionNotFound, EntryNotFound).
  Point the client at it with ``HF_ENDPOINT``.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

# Files the Hub stores in LFS (their ETag is the sha256 of the content).
_LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".onnx", ".model")


def _is_lfs(path: str) -> bool:
    return path.endswith(_LFS_SUFFIXES)


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def etag(path: str, data: bytes) -> str:
    """The Hub's ETag of a file: sha256 for LFS files, the git blob id else."""
    return hashlib.sha256(data).hexdigest() if _is_lfs(path) else git_blob_id(data)


def files_of(model_dir: Path) -> dict[str, bytes]:
    """Every file of a directory by its relative path (symlinks followed)."""
    return {p.relative_to(model_dir).as_posix(): p.read_bytes()
            for p in sorted(Path(model_dir).rglob("*")) if p.is_file()}


def hub_cache(cache: Path, repo_id: str, files: dict[str, bytes], commit: str, ref: str = "main") -> Path:
    """Writes ``files`` into ``cache`` (an ``HF_HUB_CACHE``) as
    huggingface_hub lays out a download of ``repo_id`` at ``commit``, with
    ``refs/<ref>`` pointing at it. Returns the snapshot folder."""
    repo = Path(cache) / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    for rel, data in files.items():
        blob = repo / "blobs" / etag(rel, data)
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, link.parent), link)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / ref).write_text(commit)  # no newline, as huggingface_hub writes it
    return snapshot


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str
    branches: dict[str, str] = field(default_factory=dict)  # name → commit
    token: str | None = None  # private: requests need "Bearer <token>"
    gated: bool = False  # gated: the repo is visible, its files need the token

    def commit_of(self, rev: str) -> str | None:
        return rev if rev == self.commit else self.branches.get(rev)


class FakeHub:
    """A local Hub on a free port; ``requests`` records (method, path,
    authorization header) of every request."""

    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str, str | None]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                hub._handle(self, body=True)

            def do_HEAD(self):
                hub._handle(self, body=False)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def add(self, repo_id: str, files: dict[str, bytes], commit: str, branches: dict[str, str] | None = None,
            token: str | None = None, gated: bool = False) -> None:
        self.repos[repo_id] = Repo(files, commit, branches or {"main": commit}, token, gated)

    def fetched(self) -> list[str]:
        """Paths of files downloaded (GET on resolve URLs)."""
        return [p.split("/resolve/", 1)[1].split("/", 1)[1] for m, p, _ in self.requests
                if m == "GET" and "/resolve/" in p]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handle(self, h: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlparse(h.path).path)
        self.requests.append((h.command, path, h.headers.get("authorization")))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
            repo_id, what, rev = "/".join(parts[2:4]), parts[4], "/".join(parts[5:])
            repo = self._repo(h, repo_id)
            if repo is None:
                return
            commit = repo.commit_of(rev)
            if commit is None:
                return self._error(h, 404, "RevisionNotFound", f"Invalid rev id: {rev}")
            if what == "revision":
                info = {"id": repo_id, "modelId": repo_id, "sha": commit, "private": repo.token is not None,
                        "siblings": [{"rfilename": f} for f in repo.files]}
                return self._json(h, info, body)
            tree = []
            for f, data in repo.files.items():
                entry = {"type": "file", "oid": git_blob_id(data), "size": len(data), "path": f}
                if _is_lfs(f):
                    entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
                tree.append(entry)
            return self._json(h, tree, body)
        if len(parts) >= 5 and parts[2] == "resolve":
            repo_id, rev, rel = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
            repo = self._repo(h, repo_id)
            if repo is None:
                return
            commit = repo.commit_of(rev)
            if commit is None:
                return self._error(h, 404, "RevisionNotFound", f"Invalid rev id: {rev}")
            if rel not in repo.files:
                return self._error(h, 404, "EntryNotFound", f"{rel} does not exist", commit)
            data = repo.files[rel]
            h.send_response(200)
            h.send_header("Content-Type", "application/octet-stream")
            h.send_header("Content-Length", str(len(data)))
            h.send_header("ETag", f'"{etag(rel, data)}"')
            h.send_header("X-Repo-Commit", commit)
            h.end_headers()
            if body:
                h.wfile.write(data)
            return
        self._error(h, 404, None, "not found")

    def _repo(self, h, repo_id: str) -> Repo | None:
        repo = self.repos.get(repo_id)
        authorised = repo is not None and h.headers.get("authorization") == f"Bearer {repo.token}"
        if repo is not None and repo.gated and not authorised:
            self._error(h, 403, "GatedRepo", "Access to this model is restricted: you must accept its conditions")
            return None
        if repo is not None and repo.token and not repo.gated and not authorised:
            repo = None  # the Hub hides private repos from those without access
        if repo is None:
            self._error(h, 401, "RepoNotFound", "Repository not found")
        return repo

    @staticmethod
    def _json(h, data, body: bool) -> None:
        raw = json.dumps(data).encode()
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(raw)))
        h.end_headers()
        if body:
            h.wfile.write(raw)

    @staticmethod
    def _error(h, status: int, code: str | None, message: str, commit: str | None = None) -> None:
        raw = json.dumps({"error": message}).encode()
        h.send_response(status)
        if code:
            h.send_header("X-Error-Code", code)
        h.send_header("X-Error-Message", message)
        if commit:
            h.send_header("X-Repo-Commit", commit)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(len(raw)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(raw)
