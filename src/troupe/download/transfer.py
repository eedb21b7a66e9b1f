"""One file from the hub into the cache: resumed with ``Range``, retried, verified.

The bytes go to ``blobs/<oid>.downloadInProgress`` (held with ``flock``, so two
processes never append to one file), are hashed as they arrive (the prefix of a resumed
file is hashed first, in bounded steps), and the file becomes ``blobs/<oid>`` only when
its size and digest match the hub's listing: the LFS sha256, or for a plain git file the
git blob id (sha1 of ``"blob <size>\\0"`` + content). A digest that does not match
deletes the partial file: nothing tells which bytes were wrong.

Disk work (write, hash, fsync) runs in worker threads in steps of at most 1 MiB (writes,
or what arrived before a quarter second without data) or 64 MiB (hashing a resumed
prefix), so a cancellation takes effect within a step; the network side is plain Trio
I/O and stops at once. Bytes already received when a
connection drops or the job is paused are kept (written under a shield): TCP delivered
them intact, and the next request asks for the rest.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import attrs
import trio

from troupe.download.hubapi import HubError, reason
from troupe.download.layout import RepoLayout
from troupe.download.plan import PlannedFile

if TYPE_CHECKING:
    import httpx  # loaded with the client (troupe.download.hubapi.open_client)

__all__ = ["DEFAULT_POLICY", "BusyError", "ChecksumError", "RetryPolicy", "fetch_file"]

WRITE_STEP = 1 << 20
WRITE_EVERY = 0.25  # seconds without a byte: what arrived goes to disk
HASH_STEP = 64 << 20
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)\Z")

Progress = Callable[[int], None]  # bytes of the file on disk so far


class ChecksumError(Exception):
    """The bytes received are not the file the hub lists (size or digest)."""


class BusyError(Exception):
    """Another process is downloading the same blob."""


class _Transient(Exception):
    """Worth another attempt (a dropped connection, a short body, a bad range answer)."""


@attrs.frozen
class RetryPolicy:
    attempts: int = 5  # failed attempts in a row (one that made progress resets the count)
    backoff: float = 0.5  # first wait, doubled each time
    backoff_max: float = 8.0

    def delay(self, failures: int) -> float:
        return float(min(self.backoff_max, self.backoff * 2 ** (failures - 1)))


DEFAULT_POLICY = RetryPolicy()


class _Sink:
    """The partial file, its lock and its running digest. Used from worker threads, one
    call at a time."""

    def __init__(self, path: Path, f: PlannedFile) -> None:
        self.path = path
        self.file = f
        self.fh: BinaryIO = open(path, "ab+")  # noqa: SIM115  (closed by close())
        try:
            fcntl.flock(self.fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self.fh.close()
            raise BusyError(f"{f.path} is being downloaded by another process") from None
        self.size = os.fstat(self.fh.fileno()).st_size
        self.hashed = 0
        self.hasher = self._new_hasher()
        if self.size > f.size:
            self.reset()

    def _new_hasher(self) -> Any:
        if self.file.sha256:
            return hashlib.sha256()
        h = hashlib.sha1(usedforsecurity=False)
        h.update(b"blob %d\0" % self.file.size)
        return h

    def hash_prefix(self, limit: int) -> None:
        """Hash up to ``limit`` more bytes of what was on disk before this run."""
        self.fh.seek(self.hashed)
        todo = min(limit, self.size - self.hashed)
        while todo > 0:
            block = self.fh.read(min(todo, 1 << 20))
            if not block:
                raise OSError(f"{self.path}: shorter than expected")
            self.hasher.update(block)
            self.hashed += len(block)
            todo -= len(block)

    def write(self, data: bytes) -> None:
        self.fh.seek(0, os.SEEK_END)
        self.fh.write(data)
        self.hasher.update(data)
        self.size += len(data)
        self.hashed = self.size

    def reset(self) -> None:
        self.fh.truncate(0)
        self.size = self.hashed = 0
        self.hasher = self._new_hasher()

    def verify_and_keep(self, blob: Path) -> None:
        f = self.file
        if self.size != f.size:
            self.discard()
            raise ChecksumError(f"{f.path}: size {self.size} bytes, the hub lists {f.size}")
        digest = self.hasher.hexdigest()
        want = f.sha256 or f.git_oid
        if digest != want:
            self.discard()
            kind = "sha256" if f.sha256 else "git blob id"
            raise ChecksumError(f"{f.path}: {kind} mismatch (expected {want}, got {digest})")
        self.fh.flush()
        os.fsync(self.fh.fileno())
        os.replace(self.path, blob)

    def discard(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def close(self) -> None:
        self.fh.close()


async def fetch_file(
    client: httpx.AsyncClient,
    url: str,
    f: PlannedFile,
    layout: RepoLayout,
    on_progress: Progress,
    policy: RetryPolicy = DEFAULT_POLICY,
) -> None:
    """Fetch ``f`` from ``url`` into ``layout.blob(f)``, resuming any partial file."""
    import httpx  # noqa: PLC0415  (loaded already: the client is httpx's)

    partial = layout.partial(f)
    partial.parent.mkdir(parents=True, exist_ok=True)
    sink = await trio.to_thread.run_sync(_Sink, partial, f)
    try:
        while sink.hashed < sink.size:
            await trio.to_thread.run_sync(sink.hash_prefix, HASH_STEP)
        on_progress(sink.size)
        failures = 0
        while sink.size < f.size:
            before = sink.size
            try:
                await _stream(client, url, sink, on_progress)
                if sink.size < f.size:
                    raise _Transient(f"the body ended at {sink.size} of {f.size} bytes")
            except (httpx.TransportError, _Transient, HubError) as exc:
                if isinstance(exc, HubError) and not exc.retryable:
                    raise
                failures = 1 if sink.size > before else failures + 1
                if failures > policy.attempts:
                    raise HubError(
                        f"{f.path}: {_describe(exc)} (gave up after {policy.attempts} attempts)"
                    ) from None
                await trio.sleep(policy.delay(failures))
        await trio.to_thread.run_sync(sink.verify_and_keep, layout.blob(f))
    finally:
        sink.close()


async def _stream(client: httpx.AsyncClient, url: str, sink: _Sink, on_progress: Progress) -> None:
    headers = {"Accept-Encoding": "identity"}
    if sink.size:
        headers["Range"] = f"bytes={sink.size}-"
    async with client.stream("GET", url, headers=headers) as resp:
        if resp.status_code == 416:
            await trio.to_thread.run_sync(sink.reset)
            raise _Transient("the hub refused the range; starting over")
        if resp.status_code not in (200, 206):
            await resp.aread()
            raise HubError(f"{sink.file.path}: {reason(resp)}", resp.status_code)
        if resp.status_code == 200 and sink.size:
            await trio.to_thread.run_sync(sink.reset)  # the server ignored the range
        elif resp.status_code == 206:
            m = _CONTENT_RANGE.match(resp.headers.get("Content-Range", ""))
            if m is None or int(m.group(1)) != sink.size:
                await trio.to_thread.run_sync(sink.reset)
                raise _Transient("the hub answered another range; starting over")
        await _receive(resp, sink, on_progress)


async def _receive(resp: httpx.Response, sink: _Sink, on_progress: Progress) -> None:
    """The body into the sink: written every `WRITE_STEP` bytes, and whenever nothing
    arrived for `WRITE_EVERY` seconds, so what a stalled connection delivered is on disk
    (a crash then loses nothing that arrived). The socket is read by its own task
    through a small channel: only a channel receive is ever timed out, never a read."""
    send, recv = trio.open_memory_channel[bytes](64)
    failure: list[BaseException] = []

    async def pump() -> None:
        async with send:
            try:
                async for chunk in resp.aiter_raw():
                    await send.send(chunk)
            except Exception as exc:  # handed over, re-raised below as it was
                failure.append(exc)

    buf = bytearray()
    ended = too_long = False
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(pump)
            while not (ended or too_long):
                with trio.move_on_after(WRITE_EVERY):
                    while len(buf) < WRITE_STEP:
                        try:
                            chunk = await recv.receive()
                        except trio.EndOfChannel:
                            ended = True
                            break
                        if sink.size + len(buf) + len(chunk) > sink.file.size:
                            buf.clear()
                            too_long = True
                            nursery.cancel_scope.cancel()
                            break
                        buf += chunk
                if buf:
                    data = bytes(buf)
                    buf.clear()
                    await trio.to_thread.run_sync(sink.write, data)
                    on_progress(sink.size)  # on disk: what a crash would keep
    finally:
        if buf:
            with trio.CancelScope(shield=True):  # keep what arrived, even when cancelled
                await trio.to_thread.run_sync(sink.write, bytes(buf))
            on_progress(sink.size)
    # Raised out here, as themselves: inside the nursery they would come as a group.
    if too_long:
        await trio.to_thread.run_sync(sink.discard)
        raise ChecksumError(f"{sink.file.path}: the hub sent more bytes than it lists")
    if failure:
        raise failure[0]


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
