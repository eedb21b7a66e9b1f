"""A peer's slot file, as the KV store takes and gives it (`troupe.kvstore.replicas`):
checked as a file its own engine saved, stored under the same identity and tenant, with
nothing half-written left; offered only to its own tenant; a fetch bounded in time."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import pytest
import trio
import trio.testing

from troupe.kvstore import KvService, KvStore
from troupe.kvstore.replicas import Refused, Replicas
from troupe.kvstore.slotfile import SLOT_MAGIC
from troupe.proxy.upstream import UpstreamPool

IDENT = "0123456789abcdef0123"
TOKENS = list(range(1, 400))


def slot_bytes(tokens: list[int], cells: int = 1000) -> bytes:
    values = [-1, 1, len(tokens), *tokens, 0]
    head = struct.pack("<III", SLOT_MAGIC, 4, len(values))
    return head + struct.pack(f"<{len(values)}i", *values) + b"\x07" * cells


class Peers:
    """The cluster's side: records pushes; a fetch answers ``answer``, or hangs."""

    def __init__(self, answer: tuple[str, bytes] | None = None, hang: bool = False) -> None:
        self.answer = answer
        self.hang = hang
        self.pushed: list[tuple[str, str, str, str, int]] = []
        self.pushed_one = trio.Event()

    async def push(self, model: str, ident: str, tenant: str, sha256: str, data: bytes) -> None:
        self.pushed.append((model, ident, tenant, sha256, len(data)))
        self.pushed_one.set()

    async def fetch(
        self, model: str, ident: str, tenant: str, tokens: list[int], better_than: int, limit: int
    ) -> tuple[str, bytes] | None:
        if self.hang:
            await trio.sleep_forever()
        return self.answer


def replicas(tmp_path: Path, peers: Peers, limit: int = 1 << 20) -> tuple[KvService, Replicas]:
    kv = KvService(KvStore(tmp_path / "kv", 1 << 30), children=UpstreamPool())
    kv.replicas = Replicas(kv, peers, replicas=1, limit=limit, timeout=5.0)
    return kv, kv.replicas


def files(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in (tmp_path / "kv").rglob("*") if p.is_file())


async def test_a_good_file_is_stored_under_its_identity_and_tenant(tmp_path: Path) -> None:
    kv, rep = replicas(tmp_path, Peers())
    data = slot_bytes(TOKENS)
    entry = await rep.receive("m", IDENT, "alice", hashlib.sha256(data).hexdigest(), data)
    assert (entry.ident, entry.tenant, entry.tokens) == (IDENT, "alice", tuple(TOKENS))
    assert kv.store is not None
    assert kv.store.file(entry).read_bytes() == data
    assert rep.offer(IDENT, "alice", TOKENS, 0) == entry
    assert rep.offer(IDENT, "bob", TOKENS, 0) is None  # never another tenant's
    assert rep.offer(IDENT, "alice", TOKENS, len(TOKENS)) is None  # nothing better
    assert await rep.read(entry) == data
    # A store reopened (a restart) finds it as its own save.
    again = KvStore(tmp_path / "kv", 1 << 30)
    again.open()
    assert [e.name for e in again.entries(IDENT)] == [entry.name]


@pytest.mark.parametrize(
    ("ident", "data", "sha", "status"),
    [
        ("../../etc", slot_bytes(TOKENS), None, 400),  # not an identity: never a path
        (IDENT, slot_bytes(TOKENS), "0" * 64, 400),  # not the sha256 its sender signed
        (IDENT, b"not a slot file" * 100, None, 400),
        (IDENT, slot_bytes(TOKENS[:10]), None, 400),  # too few tokens to keep
        (IDENT, slot_bytes(TOKENS, cells=2 << 20), None, 413),  # over the limit
    ],
)
async def test_a_bad_file_is_refused_and_leaves_nothing(
    tmp_path: Path, ident: str, data: bytes, sha: str | None, status: int
) -> None:
    kv, rep = replicas(tmp_path, Peers())
    with pytest.raises(Refused) as refused:
        await rep.receive("m", ident, "", sha or hashlib.sha256(data).hexdigest(), data)
    assert refused.value.status == status
    assert files(tmp_path) == []  # no temporary file, no slot file, no sidecar
    assert kv.store is not None
    assert kv.store.entries() == []


async def test_a_fetch_stores_the_peers_file_and_a_hung_peer_costs_the_timeout(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    data = slot_bytes(TOKENS)
    _, rep = replicas(tmp_path, Peers((hashlib.sha256(data).hexdigest(), data)))
    assert await rep.fetch("m", IDENT, "", [*TOKENS, 5, 6], 0) == len(TOKENS)
    assert rep.offer(IDENT, "", TOKENS, 0) is not None

    _, hung = replicas(tmp_path / "hung", Peers(hang=True))
    started = trio.current_time()
    assert await hung.fetch("m", IDENT, "", TOKENS, 0) == 0
    assert trio.current_time() - started == pytest.approx(5.0)

    _, forged = replicas(tmp_path / "forged", Peers(("0" * 64, data)))
    assert await forged.fetch("m", IDENT, "", TOKENS, 0) == 0
    assert files(tmp_path / "forged") == []


async def test_a_save_is_pushed_once_its_turn_comes(tmp_path: Path) -> None:
    peers = Peers()
    kv, rep = replicas(tmp_path, peers)
    data = slot_bytes(TOKENS)
    sha = hashlib.sha256(data).hexdigest()
    entry = await Replicas(kv, Peers(), replicas=1, limit=1 << 20, timeout=5).receive(
        "m", IDENT, "t", sha, data
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(rep.run)
        rep.saved(entry)  # (received files are not pushed again: only saves are)
        with trio.fail_after(5):
            await peers.pushed_one.wait()
        nursery.cancel_scope.cancel()
    assert peers.pushed == [("m", IDENT, "t", sha, len(data))]


async def test_a_slots_stamp_changes_with_every_request_placed_on_it() -> None:
    from troupe.kvstore.slots import SlotMap  # noqa: PLC0415

    slots = SlotMap([0], set(), private=True)
    claim = slots.choose("conv", "hello", "alice")
    assert claim is not None
    stamp = slots.stamp(0)
    slots.release(claim, answered=True, tokens=300)
    assert slots.stamp(0) == stamp  # given back: nothing placed on it since
    again = slots.choose("other", "bye", "bob")
    assert again is not None
    assert slots.stamp(0) != stamp
    slots.release(again, answered=True, tokens=300)
    with slots.loose():  # a request the engine places itself: whose tokens, unknown
        pass
    assert slots.stamp(0) == (2, None)
