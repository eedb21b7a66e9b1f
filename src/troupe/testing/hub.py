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

import contextlib
import hashlib
import http.server
import json
import re
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import attrs

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

TOKEN = "hf_" + "t" * 34  # llama.cpp only sends tokens shaped like hf_ + 34..253 alnum

_LFS_SUFFIXES = (".gguf", ".bin", ".safetensors")
_RANGE = re.compile(r"bytes=(\d+)-(\d*)\Z")
_CHUNK = 64 << 10


def git_blob_oid(data: bytes) -> str:
    """The git object id of a file's content: what the hub lists as ``oid``."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


@attrs.define
class Fault:
    """What goes wrong when a file is fetched (``GET`` on ``resolve``).

    ``drop_at``: close the connection once this many bytes of the *file* were sent (a
    resumed request that starts past it is served whole); ``drops`` such responses, then
    normal service. ``corrupt``: flip one byte in what is sent. ``rate``: bytes per second.
    ``status``: answer that status (``times`` times; None: always) instead of the file.
    ``stall_at``: after this many bytes of the file, send nothing more (the connection
    stays open until the client gives up or the hub stops). ``ignore_range``: answer a
    ``Range`` request with the whole file (200), as some proxies do.
    """

    drop_at: int | None = None
    drops: int = 1
    corrupt: bool = False
    rate: float | None = None
    status: int | None = None
    times: int | None = None
    stall_at: int | None = None
    ignore_range: bool = False


@attrs.define
class HubRepo:
    repo_id: str
    files: dict[str, bytes]
    private: bool = False
    branch: str = "main"
    faults: dict[str, Fault] = attrs.field(factory=dict)

    @property
    def commit(self) -> str:
        h = hashlib.sha1(self.repo_id.encode(), usedforsecurity=False)
        for path in sorted(self.files):
            h.update(path.encode() + b"\0" + hashlib.sha256(self.files[path]).digest())
        return h.hexdigest()

    def entry(self, path: str) -> dict[str, object]:
        data = self.files[path]
        item: dict[str, object] = {
            "type": "file",
            "oid": git_blob_oid(data),
            "size": len(data),
            "path": path,
        }
        if path.endswith(_LFS_SUFFIXES):
            sha = hashlib.sha256(data).hexdigest()
            item["lfs"] = {"oid": sha, "size": len(data), "pointerSize": 134}
        return item

    def etag(self, path: str) -> str:
        lfs = self.entry(path).get("lfs")
        return str(lfs["oid"]) if isinstance(lfs, dict) else git_blob_oid(self.files[path])


@attrs.frozen
class RequestRecord:
    method: str
    path: str
    range: str | None
    authorized: bool
    status: int
    sent: int  # body bytes sent


class Hub:
    """The hub's content, faults and request log; shared with the handler threads."""

    def __init__(self, token: str = TOKEN) -> None:
        self.token = token
        self.repos: dict[str, HubRepo] = {}
        self.requests: list[RequestRecord] = []
        self.rate: float | None = None  # bytes per second for every file
        self.page_size: int | None = None  # tree entries per page; None: one page
        self.url = ""  # "http://127.0.0.1:PORT/", set by open_hub
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self._busy = 0  # requests being answered
        self._idle = threading.Condition(self.lock)

    def add_repo(
        self,
        repo_id: str,
        files: Mapping[str, bytes | Path],
        *,
        private: bool = False,
        branch: str = "main",
    ) -> HubRepo:
        content = {p: v.read_bytes() if isinstance(v, Path) else v for p, v in files.items()}
        repo = HubRepo(repo_id, content, private=private, branch=branch)
        with self.lock:
            self.repos[repo_id] = repo
        return repo

    def fault(self, repo_id: str, path: str, fault: Fault | None) -> None:
        with self.lock:
            faults = self.repos[repo_id].faults
            if fault is None:
                faults.pop(path, None)
            else:
                faults[path] = fault

    def file_url(self, repo_id: str, path: str, rev: str | None = None) -> str:
        repo = self.repos[repo_id]
        return f"{self.url}{repo_id}/resolve/{rev or repo.commit}/{quote(path)}"

    def gets(self, path_suffix: str) -> list[RequestRecord]:
        """The ``GET`` requests for a file (its path ends with ``path_suffix``)."""
        with self.lock:
            return [r for r in self.requests if r.method == "GET" and r.path.endswith(path_suffix)]

    def sent(self, path_suffix: str) -> int:
        return sum(r.sent for r in self.gets(path_suffix))

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Return once no request is being answered (a cancelled client's response is
        recorded only when its handler notices the client went away)."""
        with self._idle:
            if not self._idle.wait_for(lambda: self._busy == 0, timeout):
                raise TimeoutError("the hub is still answering requests")


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 60  # a client that stops talking frees its thread
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass  # the request log is Hub.requests

    def do_GET(self) -> None:
        self._route("GET")

    def do_HEAD(self) -> None:
        self._route("HEAD")

    # ----- plumbing ----------------------------------------------------------------

    @property
    def hub(self) -> Hub:
        return self.server.hub

    def _record(self, status: int, sent: int = 0) -> None:
        with self.hub.lock:
            self.hub.requests.append(
                RequestRecord(
                    self.command,
                    unquote(urlsplit(self.path).path),
                    self.headers.get("Range"),
                    self._authorized(),
                    status,
                    sent,
                )
            )

    def _authorized(self) -> bool:
        return self.headers.get("Authorization", "") == f"Bearer {self.hub.token}"

    def _send(
        self, status: int, body: bytes, headers: Mapping[str, str] | None = None, *, head: bool
    ) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)
        self._record(status, 0 if head else len(body))

    def _json(self, value: object, status: int = 200, *, head: bool = False, **extra: str) -> None:
        headers = {"Content-Type": "application/json; charset=utf-8", **extra}
        self._send(status, json.dumps(value).encode(), headers, head=head)

    def _error(self, status: int, code: str, message: str, *, head: bool = False) -> None:
        self._json({"error": message}, status, head=head, **{"X-Error-Code": code})

    # ----- routes ------------------------------------------------------------------

    def _route(self, method: str) -> None:
        with self.hub.lock:
            self.hub._busy += 1
        try:
            self._answer(method)
        finally:
            with self.hub.lock:
                self.hub._busy -= 1
                self.hub._idle.notify_all()

    def _answer(self, method: str) -> None:
        url = urlsplit(self.path)
        path = unquote(url.path).lstrip("/")
        head = method == "HEAD"
        if path.startswith("api/models/"):
            self._api(path[len("api/models/") :], parse_qs(url.query), head=head)
            return
        m = re.fullmatch(r"([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m is None:
            self._error(404, "EntryNotFound", "Not found", head=head)
            return
        repo = self._repo(m.group(1), head=head)
        if repo is not None and self._revision(repo, m.group(2), head=head):
            self._resolve(repo, m.group(3), head=head)

    def _repo(self, repo_id: str, *, head: bool) -> HubRepo | None:
        with self.hub.lock:
            repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", "Repository not found", head=head)
            return None
        if repo.private and not self._authorized():
            msg = (
                f"Access to model {repo_id} is restricted. You must be authenticated to access it."
            )
            self._error(401, "GatedRepo", msg, head=head)
            return None
        return repo

    def _revision(self, repo: HubRepo, rev: str, *, head: bool) -> bool:
        if rev in (repo.branch, repo.commit):
            return True
        self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head=head)
        return False

    def _api(self, rest: str, query: dict[str, list[str]], *, head: bool) -> None:
        parts = rest.split("/")
        repo = self._repo("/".join(parts[:2]), head=head)
        if repo is None:
            return
        tail = parts[2:]
        if tail == ["refs"]:
            branch = {"name": repo.branch, "ref": f"refs/heads/{repo.branch}"}
            branch["targetCommit"] = repo.commit
            self._json({"branches": [branch], "converts": [], "tags": []}, head=head)
        elif len(tail) >= 2 and tail[0] == "tree":
            if self._revision(repo, tail[1], head=head):
                self._tree(repo, tail[1], query, head=head)
        elif not tail or (len(tail) == 2 and tail[0] == "revision"):
            if tail and not self._revision(repo, tail[1], head=head):
                return
            info = {
                "_id": repo.commit[:24],
                "id": repo.repo_id,
                "modelId": repo.repo_id,
                "sha": repo.commit,
                "private": repo.private,
                "tags": ["gguf"],
                "siblings": [{"rfilename": p} for p in sorted(repo.files)],
            }
            self._json(info, head=head)
        else:
            self._error(404, "EntryNotFound", "Not found", head=head)

    def _tree(self, repo: HubRepo, rev: str, query: dict[str, list[str]], *, head: bool) -> None:
        entries: list[dict[str, object]] = []
        dirs: set[str] = set()
        recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
        for path in sorted(repo.files):
            if "/" in path and not recursive:
                dirs.add(path.split("/", 1)[0])
                continue
            entries.append(repo.entry(path))
        entries = [{"type": "directory", "oid": "0" * 40, "size": 0, "path": d} for d in dirs] + (
            entries
        )
        start = int(query.get("cursor", ["0"])[0])
        size = self.hub.page_size or len(entries) or 1
        page = entries[start : start + size]
        extra: dict[str, str] = {}
        if start + size < len(entries):
            base = f"{self.hub.url}api/models/{repo.repo_id}/tree/{rev}"
            extra["Link"] = f'<{base}?recursive={recursive}&cursor={start + size}>; rel="next"'
        self._json(page, 200, head=head, **extra)

    def _resolve(self, repo: HubRepo, path: str, *, head: bool) -> None:
        data = repo.files.get(path)
        if data is None:
            self._error(404, "EntryNotFound", f"{path} does not exist", head=head)
            return
        with self.hub.lock:
            fault = repo.faults.get(path)
            if fault is not None and fault.status is not None and not head:
                if fault.times is not None:
                    fault.times -= 1
                    if fault.times <= 0:
                        repo.faults.pop(path, None)
                status = fault.status
            else:
                status = 0
        if status:
            self._error(status, "Fault", f"injected status {status}")
            return
        headers = {
            "ETag": f'"{repo.etag(path)}"',
            "X-Repo-Commit": repo.commit,
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if "lfs" in repo.entry(path):
            headers["X-Linked-Etag"] = headers["ETag"]
            headers["X-Linked-Size"] = str(len(data))
        start, end = 0, len(data)
        status = 200
        rng = None if fault is not None and fault.ignore_range else self.headers.get("Range")
        if rng is not None:
            m = _RANGE.match(rng.strip())
            if m is None or int(m.group(1)) >= len(data) > 0:
                headers["Content-Range"] = f"bytes */{len(data)}"
                self._send(416, b"", headers, head=head)
                return
            start = int(m.group(1))
            end = min(len(data), int(m.group(2)) + 1) if m.group(2) else len(data)
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{len(data)}"
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        sent = 0 if head else self._body(repo, path, data, start, end)
        self._record(status, sent)

    def _body(self, repo: HubRepo, path: str, data: bytes, start: int, end: int) -> int:
        with self.hub.lock:
            fault = repo.faults.get(path) or Fault()
            drop_at = fault.drop_at if fault.drops > 0 and (fault.drop_at or 0) > start else None
            if drop_at is not None:
                fault.drops -= 1
            rate = fault.rate or self.hub.rate
        body = bytearray(data[start:end])
        if fault.corrupt and body:
            body[len(body) // 2] ^= 0xFF
        stop = len(body) if drop_at is None else min(len(body), drop_at - start)
        stall = None if fault.stall_at is None else max(0, fault.stall_at - start)
        sent = 0
        began = time.monotonic()
        while sent < stop and not self.hub.stopping.is_set():
            if stall is not None and sent >= stall:
                self.hub.stopping.wait()  # hold the connection open, silent
                break
            limit = stop if stall is None else min(stop, stall)
            piece = bytes(body[sent : min(limit, sent + _CHUNK)])
            if rate:
                # Smooth pacing: never ahead of the rate (sleeping in short steps so a
                # stopping hub is noticed).
                piece = piece[: max(1, int(rate / 20))]
                while (ahead := (sent + len(piece)) / rate - (time.monotonic() - began)) > 0:
                    if self.hub.stopping.wait(min(ahead, 0.05)):
                        break
            try:
                self.wfile.write(piece)
                self.wfile.flush()
            except OSError:
                break  # the client went away
            sent += len(piece)
        if sent < len(body):
            self.close_connection = True
            self._drop()
        return sent

    def _drop(self) -> None:
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = True  # server_close joins the handler threads

    def __init__(self, hub: Hub) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.hub = hub
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._open_lock:
                self._open.discard(request)

    def close_connections(self) -> None:
        """End every kept-alive or slow connection, so its thread returns at once."""
        with self._open_lock:
            for conn in self._open:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)


def tiny_repo_files(directory: Path, *paths: str, seed: int = 0) -> dict[str, Path]:
    """A tiny real model (`troupe.testing.write_tiny_gguf`) for each repository path,
    written under ``directory``: ``{"m-Q4_K_M.gguf": Path, ...}`` for `Hub.add_repo`.
    Each file is a distinct, loadable model named after its file."""
    from troupe.testing.tiny_gguf import TinyModel, write_tiny_gguf  # noqa: PLC0415  (numpy)

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
    server = _Server(hub)
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
