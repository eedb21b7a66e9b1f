"""A small Hugging Face-compatible hub on loopback, with faults on demand.

It serves what llama.cpp's downloader (``common/hf-cache.cpp``, ``common/download.cpp``),
``huggingface_hub`` (``hf_hub_download``, ``snapshot_download``, ``HfApi.model_info``)
and troupe's downloader ask a hub for:

* ``GET {endpoint}api/models/{repo}/refs``: ``{"branches":[{"name","ref","targetCommit"}],...}``
* ``GET {endpoint}api/models/{repo}/tree/{rev}?recursive=true``: the file list, each
  ``{"type":"file","oid":<git sha1>,"size","path"}`` plus ``"lfs":{"oid":<sha256>,"size",
  "pointerSize"}`` for a ``.gguf`` (HF stores those in LFS); paginated with a ``Link``
  header when ``page_size`` is set.
* ``GET {endpoint}api/models/{repo}[/revision/{rev}]``: the model info (``sha``, ``siblings``).
* ``HEAD``/``GET {endpoint}{repo}/resolve/{rev}/{path}``: ``ETag``, ``X-Repo-Commit``,
  ``X-Linked-Etag``/``X-Linked-Size`` (LFS files), ``Content-Length``,
  ``Accept-Ranges: bytes``; ``Range: bytes=N-[M]`` answers 206 with ``Content-Range``.

Errors look like the hub's: 404 with ``X-Error-Code: RepoNotFound`` / ``RevisionNotFound``
/ ``EntryNotFound`` and ``{"error": ...}``; a private repo answers 401 without the right
``Authorization: Bearer`` token. Faults (`Fault`) are set per file and may change while a
download runs: drop the connection after N body bytes, flip a byte, throttle to N bytes/s,
or answer a status. Every request is recorded (`Hub.requests`) so a test can assert what
a client asked for (a ``Range`` after a dropped connection, say).

Threads (``http.server``), so it serves sync clients (``huggingface_hub``) and Trio tests
alike. `open_hub` binds port 0 and, on exit, stops every handler, slow ones included.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from troupe_rig.hub_http import HubServer
from troupe_rig.hub_state import TOKEN, Fault, Hub, HubRepo, RequestRecord, git_blob_oid

__all__ = [
    "TOKEN",
    "Fault",
    "Hub",
    "HubRepo",
    "RequestRecord",
    "git_blob_oid",
    "open_hub",
    "tiny_repo_files",
]


def tiny_repo_files(directory: Path, *paths: str, seed: int = 0) -> dict[str, Path]:
    """A tiny real model (`troupe_rig.write_tiny_gguf`) for each repository path,
    written under ``directory``: ``{"m-Q4_K_M.gguf": Path, ...}`` for `Hub.add_repo`.
    Each file is a distinct, loadable model named after its file."""
    from troupe_rig.tiny_gguf import TinyModel, write_tiny_gguf  # noqa: PLC0415  (numpy)

    out: dict[str, Path] = {}
    for i, rel in enumerate(paths):
        target = directory / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        stem = rel.rsplit("/", 1)[-1].removesuffix(".gguf")
        out[rel] = write_tiny_gguf(target, TinyModel(name=stem, seed=seed + i))
    return out


@contextmanager
def open_hub(token: str = TOKEN) -> Iterator[Hub]:
    """Serve a `Hub` on ``127.0.0.1`` (a free port) until the block ends."""
    hub = Hub(token)
    server = HubServer(hub)
    hub.url = f"http://127.0.0.1:{server.server_address[1]}/"
    thread = threading.Thread(target=server.serve_forever, name="troupe-test-hub", daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        hub.stopping.set()
        server.shutdown()
        server.close_connections()
        server.server_close()
        thread.join()
