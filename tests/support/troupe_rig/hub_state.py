"""The test hub's content, faults and request log (see `troupe_rig.hub`)."""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from urllib.parse import quote

import attrs

__all__ = ["TOKEN", "Fault", "Hub", "HubRepo", "RequestRecord", "git_blob_oid"]

TOKEN = "hf_" + "t" * 34  # llama.cpp only sends tokens shaped like hf_ + 34..253 alnum

_LFS_SUFFIXES = (".gguf", ".bin", ".safetensors")


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
        self.next_base: str | None = None  # where Link: rel="next" points; None: here
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

    @contextlib.contextmanager
    def answering(self) -> Iterator[None]:
        """Held by a handler thread while it answers one request (see `wait_idle`)."""
        with self.lock:
            self._busy += 1
        try:
            yield
        finally:
            with self.lock:
                self._busy -= 1
                self._idle.notify_all()

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Return once no request is being answered (a cancelled client's response is
        recorded only when its handler notices the client went away)."""
        with self._idle:
            if not self._idle.wait_for(lambda: self._busy == 0, timeout):
                raise TimeoutError("the hub is still answering requests")
