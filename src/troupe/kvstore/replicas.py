"""A conversation's KV follows it across a cluster's nodes (``--cluster-kv-replicas``).

On a node of a cluster with a secret, a conversation's slot is saved after each turn
that leaves 256 tokens or more in it (in the background, the slot not held: a node
killed at any time has its last turns' files elsewhere), and every slot file the store
saves is also pushed, in the background and best effort, to the next nodes of its
model's placement order (those failover and spill go to first); a node asked to
continue a conversation whose slot it does not hold asks its peers for the file before
it prefills (`Replicas.fetch`, bounded by ``--cluster-timeout``: a peer down or hung
costs at most that, then the usual prefill). Whether to fetch is the owner's decision
(`SlotOwner._prepare`); the transport is the cluster's (`troupe.cluster.kvsync`),
signed with the cluster secret.

A file that arrives (pushed, or fetched) is checked as a file the engine saved here:
written to a temporary file and renamed only once it reads as a slot file whose sha256
is the one its sender signed, then indexed under the same KV identity and tenant
(`Replicas.receive`). A peer is offered only its own tenant's entries (`Replicas.offer`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import trio

from troupe.kvstore.restore import MIN_MATCH
from troupe.kvstore.store import (
    FILE_MODE,
    KvEntry,
    checksum,
    common_prefix,
    describe,
    write_sidecar,
)
from troupe.modellog import about

if TYPE_CHECKING:
    from troupe.kvstore.owner import SlotOwner
    from troupe.kvstore.service import KvService

__all__ = ["IDENT", "KvPeers", "Refused", "Replicas"]

log = logging.getLogger("troupe.kvstore")

IDENT = re.compile(r"[0-9a-f]{20}\Z")  # a KV identity (`kv_identity`): a directory's name
QUEUE = 16  # saves waiting for their push; more are not pushed (best effort)
MAX_NAME = 512  # a model's or tenant's name on a node-to-node route
Job = Callable[[], Awaitable[None]]


class Refused(ValueError):
    """A pushed or fetched file that is not stored (its reason, for the log and the 4xx)."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class KvPeers(Protocol):
    """The cluster's side (`troupe.cluster.kvsync.KvLink`): the transport only."""

    async def push(self, model: str, ident: str, tenant: str, sha256: str, data: bytes) -> None:
        """``data`` (a slot file) to the model's next nodes; best effort, never raises."""

    async def fetch(
        self, model: str, ident: str, tenant: str, tokens: list[int], better_than: int, limit: int
    ) -> tuple[str, bytes] | None:
        """(sha256, file) of the first peer holding an entry for ``tokens`` sharing more
        than ``better_than`` of them; None when none has one. Unbounded in time: the
        caller bounds it."""


class Replicas:
    """This node's pushes and fetches; ``limit``: the largest file sent or taken."""

    def __init__(
        self, kv: KvService, peers: KvPeers, *, replicas: int, limit: int, timeout: float
    ) -> None:
        self.kv = kv
        self.peers = peers
        self.replicas = replicas
        self.limit = limit
        self.timeout = timeout
        # Saves after a turn and pushes, carried out one at a time (`run`).
        self._send, self._queue = trio.open_memory_channel[Job](QUEUE)

    # ----- saving after a turn, pushing what this node saved -----------------------------------

    def after_turn(
        self, owner: SlotOwner, slot: int, tenant: str, stamp: tuple[int, str | None] | None
    ) -> None:
        """A turn on ``owner``'s ``slot`` ended: the slot saved once the queue reaches it
        (`SlotOwner.save_after_turn`), which pushes the file (`saved`)."""
        self._enqueue(partial(owner.save_after_turn, slot, tenant, stamp), owner.model)

    def saved(self, entry: KvEntry) -> None:
        """A save of this node's: pushed once the queue reaches it (dropped when it is full)."""
        if self.replicas > 0 and entry.size <= self.limit:
            self._enqueue(partial(self._push, entry), entry.model)

    def _enqueue(self, job: Job, model: str) -> None:
        with contextlib.suppress(trio.WouldBlock):
            self._send.send_nowait(job)
            return
        about(log, model).info("KV: a save or push skipped (%d waiting)", QUEUE)

    async def run(self) -> None:
        """The saves after a turn and the pushes, one at a time (beside the HTTP server)."""
        async for job in self._queue:
            await job()

    async def _push(self, entry: KvEntry) -> None:
        store = self.kv.store
        if store is None or entry not in store.entries(entry.ident):
            return  # displaced meanwhile (a newer save of the same conversation)
        try:
            data = await trio.to_thread.run_sync(store.file(entry).read_bytes)
        except OSError:
            return
        await self.peers.push(entry.model, entry.ident, entry.tenant, entry.sha256, data)

    # ----- asking the peers --------------------------------------------------------------------

    async def fetch(self, model: str, ident: str, tenant: str, tokens: list[int], have: int) -> int:
        """The peers' entry for ``tokens`` (better than the ``have`` tokens found here)
        stored here; returns how many of its tokens it shares with ``tokens`` (0: none
        came within ``timeout``, or it was refused)."""
        mlog = about(log, model)
        started = trio.current_time()
        got: tuple[str, bytes] | None = None
        with trio.move_on_after(self.timeout):
            got = await self.peers.fetch(model, ident, tenant, tokens, have, self.limit)
        if got is None:
            return 0
        sha256, data = got
        try:
            entry = await self.receive(model, ident, tenant, sha256, data)
        except Refused as exc:
            mlog.warning("KV: a peer's slot file refused: %s", exc)
            return 0
        shared = common_prefix(entry.tokens, tokens)
        mlog.info(
            "KV: fetched a peer's slot file (%d tokens, %.1f MiB) in %.0f ms",
            len(entry.tokens),
            entry.size / (1 << 20),
            (trio.current_time() - started) * 1000,
        )
        self.kv.metrics.restores.labels(model, "fetched").inc()
        return shared

    # ----- a peer's file, arriving -------------------------------------------------------------

    async def receive(
        self, model: str, ident: str, tenant: str, sha256: str, data: bytes
    ) -> KvEntry:
        """``data`` stored as ``tenant``'s entry of ``ident``, checked as a file this node's
        engine saved: a slot file whose sha256 is ``sha256``. Raises `Refused`; nothing
        half-written stays (a temporary file, renamed once checked)."""
        store = self.kv.store
        if store is None:
            raise Refused(404, "this node keeps no KV files")
        if not IDENT.match(ident) or not model or len(model) > MAX_NAME or len(tenant) > MAX_NAME:
            raise Refused(400, "not a KV identity, model and tenant")
        if len(data) > self.limit:
            raise Refused(413, f"a slot file of {len(data)} bytes (the limit is {self.limit})")
        name = store.new_name()
        final = store.slot_dir(ident) / f"{name}.bin"
        described = await trio.to_thread.run_sync(_write_checked, final, data, sha256)
        if described is None:
            raise Refused(400, "not a slot file with that sha256")
        tokens, size = described
        if len(tokens) < self.kv.min_tokens:
            final.unlink(missing_ok=True)
            raise Refused(400, f"{len(tokens)} tokens: too few to keep")
        entry = KvEntry(ident, name, model, tokens, sha256, size, 0.0, tenant)
        store.touch(entry)
        try:
            await trio.to_thread.run_sync(write_sidecar, entry, store.root)
        except BaseException:
            final.unlink(missing_ok=True)
            raise
        self.kv.stored(entry)
        return entry

    def offer(self, ident: str, tenant: str, tokens: list[int], better_than: int) -> KvEntry | None:
        """``tenant``'s own entry of ``ident`` sharing the most of ``tokens``, when that is
        more than ``better_than`` (and `MIN_MATCH` at least)."""
        store = self.kv.store
        if store is None or not IDENT.match(ident):
            return None
        match = store.best_match(ident, tokens, tenant=tenant)
        if match is None or match[1] < MIN_MATCH or match[1] <= better_than:
            return None
        return match[0]

    async def read(self, entry: KvEntry) -> bytes | None:
        """``entry``'s file, when it is whole (its checksum); a corrupt one is dropped."""
        store = self.kv.store
        if store is None or entry.size > self.limit:
            return None
        path = store.file(entry)
        try:
            data = await trio.to_thread.run_sync(path.read_bytes)
            digest = await trio.to_thread.run_sync(checksum, path)
        except OSError:
            return None
        if digest != entry.sha256 or len(data) != entry.size:
            mlog = about(log, entry.model)
            mlog.warning("KV entry %s is corrupt (checksum): dropped", entry.name)
            store.drop(entry)
            return None
        return data


def _write_checked(final: Path, data: bytes, sha256: str) -> tuple[tuple[int, ...], int] | None:
    """``data`` at ``final`` when it is a slot file of that sha256 (its tokens and size);
    else nothing written (None)."""
    tmp = final.with_name(final.name + ".tmp")  # (`KvStore.open` drops a .tmp left behind)
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        described = describe(tmp)
        if described is None or described[1] != sha256:
            return None
        os.replace(tmp, final)
        return described[0], described[2]
    finally:
        tmp.unlink(missing_ok=True)
