"""The HTTP side of the test hub (`troupe_rig.hub`): routes, faults, the server.

Threads (``http.server``): one per connection, HTTP/1.1 keep-alive. The server keeps
every open connection so that stopping it ends slow and kept-alive ones at once.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import re
import socket
import threading
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from troupe_rig.hub_state import Fault, Hub, HubRepo, RequestRecord

__all__ = ["HubServer"]

_RANGE = re.compile(r"bytes=(\d+)-(\d*)\Z")
_CHUNK = 64 << 10


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 60  # a client that stops talking frees its thread
    server: HubServer

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
        with self.hub.answering():
            self._answer(method)

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
            where = self.hub.next_base or self.hub.url
            base = f"{where}api/models/{repo.repo_id}/tree/{rev}"
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


class HubServer(http.server.ThreadingHTTPServer):
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
