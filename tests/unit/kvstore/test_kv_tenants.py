"""The KV store with several tenants (API keys), and the files' modes, without an engine:
entries and slots are keyed by the tenant, a slot that may hold another tenant's tokens is
sent with ``"cache_prompt": false``, and a restore the engine ignored switches restores off
(over a real socket to a stand-in that answers as the engine does)."""

from __future__ import annotations

import json
import os
import stat
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio

from troupe.kvstore import KvEntry, KvService, KvStore
from troupe.kvstore.service import without_cache
from troupe.kvstore.slotfile import SLOT_MAGIC
from troupe.kvstore.slots import SlotMap
from troupe.kvstore.store import describe, write_sidecar
from troupe.proxy.upstream import UpstreamPool

TOKENS = list(range(1000, 1400))  # over the store's threshold and MIN_MATCH


def slot_file(path: Path, tokens: list[int]) -> Path:
    """As the engine writes one: ``ggsq``, version, the server's token list, cells."""
    values = [-1, 1, len(tokens), *tokens, 0]
    head = struct.pack("<III", SLOT_MAGIC, 4, len(values))
    path.write_bytes(head + struct.pack(f"<{len(values)}i", *values) + b"\x07" * 1000)
    return path


def saved(store: KvStore, ident: str, tokens: list[int], tenant: str) -> KvEntry:
    name = store.new_name()
    path = slot_file(store.slot_dir(ident) / f"{name}.bin", tokens)
    described = describe(path)
    assert described is not None
    toks, digest, size = described
    entry = KvEntry(ident, name, "m", toks, digest, size, 0.0, tenant)
    store.touch(entry)
    write_sidecar(entry, store.root)
    store.add(entry)
    return entry


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# ----- the store's files ------------------------------------------------------------------


def test_a_lookup_finds_only_its_own_tenant_s_entries_also_after_a_reopen(tmp_path: Path) -> None:
    store = KvStore(tmp_path / "kv", 1 << 30)
    alice = saved(store, "id1", TOKENS, "alice")
    assert store.best_match("id1", TOKENS, tenant="bob") is None
    assert store.best_match("id1", TOKENS) is None  # "" is a tenant like any other
    assert store.best_match("id1", TOKENS, tenant="alice") == (alice, len(TOKENS))
    # Bob's save of the same tokens displaces nothing of Alice's.
    saved(store, "id1", [*TOKENS, 7], "bob")
    again = KvStore(tmp_path / "kv", 1 << 30)
    again.open()
    assert {e.tenant for e in again.entries()} == {"alice", "bob"}
    found = again.best_match("id1", TOKENS, tenant="alice")
    assert found is not None
    assert found[0].name == alice.name


def test_the_store_s_files_are_its_user_s_alone_also_those_found_on_open(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        store = KvStore(tmp_path / "state" / "kv", 1 << 30)
        entry = saved(store, "id1", TOKENS, "")
        # As an older troupe (or the engine, with its umask) left them.
        for path in (store.root, store.root / "id1"):
            os.chmod(path, 0o755)
        for path in (store.root / "id1").iterdir():
            os.chmod(path, 0o644)
        stray = slot_file(store.root / "id1" / "stray.bin", TOKENS)  # no sidecar: deleted
    finally:
        os.umask(old)
    reopened = KvStore(store.root, 1 << 30)
    reopened.open()
    assert mode(store.root) == mode(store.root / "id1") == 0o700
    assert mode(store.file(entry)) == mode(store.file(entry).with_suffix(".json")) == 0o600
    assert not stray.exists()
    assert [e.name for e in reopened.entries()] == [entry.name]


def test_a_fresh_save_and_its_sidecar_are_0600_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        store = KvStore(tmp_path / "kv", 1 << 30)
        entry = saved(store, "id1", TOKENS, "")
    finally:
        os.umask(old)
    assert mode(store.root) == mode(store.root / "id1") == 0o700
    assert mode(store.file(entry)) == 0o600
    assert mode(store.file(entry).with_suffix(".json")) == 0o600


# ----- the live slots ------------------------------------------------------------------------


async def test_a_tenant_never_continues_another_s_slot_and_is_told_when_it_takes_one() -> None:
    slots = SlotMap([0], set(), private=True)
    text = "x" * 1000
    first = await slots.claim("", text, "alice")
    assert first is not None
    assert not first.foreign
    slots.release(first, answered=True, tokens=400)
    # Bob sends Alice's very text: not her conversation to him, and her slot is foreign.
    bob = await slots.claim("", text, "bob")
    assert bob is not None
    assert (bob.own, bob.foreign, bob.evict, bob.owner) == (False, True, True, "alice")
    slots.release(bob, answered=True, tokens=400)
    assert slots.owner(0) == "bob"
    alice = await slots.claim("", text + "more", "alice")
    assert alice is not None
    assert alice.foreign
    assert alice.owner == "bob"


async def test_with_one_tenant_nothing_is_foreign() -> None:
    slots = SlotMap([0], {0})
    got = await slots.claim("", "y" * 1000)
    assert got is not None
    assert not got.foreign
    assert got.owner == ""


# ----- the service against a stand-in engine --------------------------------------------------


class Engine:
    """Answers the store's calls as the engine does; records what it was asked."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens
        self.asked: list[str] = []

    async def serve(self, stream: trio.SocketStream) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            data += await stream.receive_some()
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n") if b"length" in ln))
        while len(body) < length:
            body += await stream.receive_some()
        method, path = head.split(b" ")[:2]
        self.asked.append(f"{method.decode()} {path.decode()}")
        answer: Any = {}
        if path == b"/slots":
            answer = [{"id": 0}, {"id": 1}]
        elif path == b"/tokenize":
            answer = {"tokens": self.tokens}
        elif b"action=restore" in path:
            answer = {"n_read": 1000}
        out = json.dumps(answer).encode()
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s"
            % (len(out), out)
        )
        await stream.aclose()


@asynccontextmanager
async def engine(tokens: list[int], *kvs: KvService) -> AsyncIterator[tuple[Engine, int]]:
    """A stand-in child, started as generation 1 of "m" in the transport of each of ``kvs``."""
    fake = Engine(tokens)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, fake.serve, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        for kv in kvs:
            kv.api.pool.started("m", 1, port)
        yield fake, port
        for kv in kvs:
            kv.api.pool.gone("m", 1)  # its exit: every connection to it closed
        nursery.cancel_scope.cancel()


def service(tmp_path: Path, private: bool) -> tuple[KvService, str]:
    kv = KvService(KvStore(tmp_path / "kv", 1 << 30), children=UpstreamPool(), private=private)
    args = kv.launch_args("m", ["llama-server", "--model", "m.gguf"], swa=False)
    ident = Path(args[args.index("--slot-save-path") + 1]).name
    return kv, ident


async def test_a_request_is_restored_only_from_its_own_tenant_s_entry(tmp_path: Path) -> None:
    kv, ident = service(tmp_path, private=True)
    saved(kv.store, ident, TOKENS, "alice")
    body = json.dumps({"model": "m", "prompt": "p", "max_tokens": 1}).encode()
    async with engine(TOKENS, kv) as (fake, _):
        async with kv.steered("m", 1, "/completion", body, tenant="bob") as hold:
            sent = json.loads(hold.body)
        assert not any("action=restore" in a for a in fake.asked)
        # An empty slot: nothing of anyone's to reuse, the request goes as usual.
        assert "cache_prompt" not in sent
        assert sent["id_slot"] == hold.slot
        async with kv.steered("m", 1, "/completion", body, tenant="alice") as hold:
            assert "cache_prompt" not in json.loads(hold.body)
        assert sum("action=restore" in a for a in fake.asked) == 1


async def test_a_slot_another_tenant_used_is_sent_without_its_cache(tmp_path: Path) -> None:
    kv, _ = service(tmp_path, private=True)
    prompt = "a shared beginning " * 40
    body = json.dumps({"model": "m", "prompt": prompt}).encode()
    async with engine(TOKENS[:10], kv) as _:
        for tenant in ("alice", "alice2"):  # both slots used, each by its own tenant
            async with kv.steered("m", 1, "/completion", body, tenant=tenant) as hold:
                hold.tokens = 12  # small: taken later without a save
        async with kv.steered("m", 1, "/completion", body, tenant="bob") as hold:
            sent = json.loads(hold.body)
        assert sent == {"id_slot": hold.slot, "cache_prompt": False, "model": "m", "prompt": prompt}
        # The client's own slot choice or cache_prompt: the engine picks whose cells.
        own = json.dumps({"model": "m", "prompt": "q", "id_slot": 1, "cache_prompt": True})
        async with kv.steered("m", 1, "/completion", own.encode(), tenant="bob") as hold:
            assert json.loads(hold.body)["cache_prompt"] is False
            assert json.loads(hold.body)["id_slot"] == 1
    # One tenant: as before, nothing added but the slot.
    single, _ = service(tmp_path / "one", private=False)
    async with engine(TOKENS[:10], single) as _:
        for _round in range(3):
            async with single.steered("m", 1, "/completion", body, tenant="bob") as hold:
                assert json.loads(hold.body) == {
                    "id_slot": hold.slot,
                    "model": "m",
                    "prompt": prompt,
                }
    args = single.launch_args("m", ["llama-server", "--model", "m.gguf"], swa=False)
    assert "--cache-ram" not in args
    args = kv.launch_args("m", ["llama-server", "--model", "m.gguf"], swa=False)
    assert args[args.index("--cache-ram") + 1] == "0"


async def test_a_restore_the_engine_ignored_switches_restores_off_for_the_model(
    tmp_path: Path,
) -> None:
    kv, ident = service(tmp_path, private=False)
    saved(kv.store, ident, TOKENS, "")
    saved(kv.store, ident, [5, *TOKENS], "")  # another conversation, for a second try
    body = json.dumps({"model": "m", "prompt": "p"}).encode()
    async with engine(TOKENS, kv) as (fake, _):
        async with kv.steered("m", 1, "/completion", body) as hold:
            hold.cached = None  # the answer did not say: nothing learnt
        assert kv.restore_off("m") is None
        async with kv.steered("m", 1, "/completion", body, conv="c2") as hold:
            hold.cached = 0  # the engine evaluated the whole prompt again
        assert sum("action=restore" in a for a in fake.asked) == 2
        off = kv.restore_off("m")
        assert off is not None
        assert "reused none of 400 restored tokens" in off
        async with kv.steered("m", 1, "/completion", body, conv="c3") as hold:
            pass
        assert sum("action=restore" in a for a in fake.asked) == 2
        assert kv.metrics.restores.labels("m", "ignored")._value.get() == 1
    # New arguments (a new identity): restores are tried again.
    kv.launch_args("m", ["llama-server", "--model", "m.gguf", "--swa-full"], swa=False)
    assert kv.restore_off("m") is None


async def test_a_restore_the_engine_used_keeps_restores_on(tmp_path: Path) -> None:
    kv, ident = service(tmp_path, private=False)
    saved(kv.store, ident, TOKENS, "")
    body = json.dumps({"model": "m", "prompt": "p"}).encode()
    async with (
        engine(TOKENS, kv) as _,
        kv.steered("m", 1, "/completion", body) as hold,
    ):
        hold.cached = 399
    assert kv.restore_off("m") is None


@pytest.mark.parametrize(
    ("body", "sent"),
    [
        (b"{}", b'{"cache_prompt":false}'),
        (b' {"input": "x"} \n', b' {"input": "x","cache_prompt":false} \n'),
        # Its own, however spelled, comes first: the last value of a key is the one read.
        (b'{"cache\\u005fprompt": true}', b'{"cache\\u005fprompt": true,"cache_prompt":false}'),
        (b"[1, 2]", b"[1, 2]"),  # not an object: as it came
        (b"", b""),
    ],
)
def test_cache_prompt_false_goes_last_in_the_client_s_own_bytes(body: bytes, sent: bytes) -> None:
    assert without_cache(body) == sent


async def test_with_several_tenants_a_request_not_steered_is_sent_without_the_cache(
    tmp_path: Path,
) -> None:
    kv, _ = service(tmp_path, private=True)
    body = b'{"model": "m", "input": "' + b"x" * (9 << 20) + b'"}'  # over the parse limit
    async with engine([], kv) as (fake, _):
        for path, sent in (("/v1/embeddings", b'{"model": "m"}'), ("/v1/completions", body)):
            async with kv.steered("m", 1, path, sent, tenant="bob") as hold:
                assert hold.slot is None
                assert hold.body.endswith(b',"cache_prompt":false}')
                assert hold.body.startswith(sent[:-1])
        assert fake.asked == []  # nothing parsed, nothing asked of the child


async def test_without_files_several_tenants_are_still_kept_apart_on_the_slots() -> None:
    # --kv-store off with several keys: the slots are steered, nothing saved or restored.
    kv = KvService(None, children=UpstreamPool(), private=True)
    base = ["llama-server", "--model", "m.gguf"]
    assert kv.launch_args("m", base, swa=True) == [
        *base, "--no-cache-idle-slots", "--cache-ram", "0",
    ]  # fmt: skip
    assert not kv.refuses("m", "/slots/0?action=save")  # the engine refuses, no slot path
    assert kv.usage("m") == (0, 0)
    prompt = "a shared beginning " * 40
    body = json.dumps({"model": "m", "prompt": prompt}).encode()
    sent: list[dict[str, Any]] = []
    async with engine(TOKENS, kv) as (fake, _):
        for tenant in ("alice", "carol", "alice", "bob"):
            async with kv.steered("m", 1, "/completion", body, tenant=tenant) as hold:
                sent.append(json.loads(hold.body))
                hold.tokens = 500
        # Two empty slots, then Alice's own again: the engine reuses what it holds.
        assert [s.get("cache_prompt") for s in sent[:3]] == [None, None, None]
        assert sent[2]["id_slot"] == sent[0]["id_slot"] != sent[1]["id_slot"]
        # Bob's prompt is hers, but every slot holds someone else's tokens.
        assert sent[3]["cache_prompt"] is False
        own = json.dumps({"model": "m", "prompt": prompt, "id_slot": sent[0]["id_slot"]})
        async with kv.steered("m", 1, "/completion", own.encode(), tenant="bob") as hold:
            assert json.loads(hold.body)["cache_prompt"] is False
        async with kv.steered("m", 1, "/v1/embeddings", b'{"input": "x"}', tenant="x") as h:
            assert h.body == b'{"input": "x","cache_prompt":false}'
        assert fake.asked == ["GET /slots"]  # no save, no tokenize, no restore
    kv.forget_models(["m"])


async def test_without_files_one_tenant_s_child_and_requests_are_left_as_they_are() -> None:
    kv = KvService(None, children=UpstreamPool())
    base = ["llama-server", "--model", "m.gguf"]
    assert kv.launch_args("m", base, swa=True) == base
    body = b'{"model": "m", "prompt": "p"}'
    async with kv.steered("m", 1, "/completion", body) as hold:
        assert (hold.slot, hold.body, hold.fresh) == (None, body, False)


def test_a_model_whose_preset_turns_the_store_off_is_steered_without_files(
    tmp_path: Path,
) -> None:
    base = ["llama-server", "--model", "m.gguf"]
    kv, _ = service(tmp_path, private=True)  # its files on for "m" first
    assert kv.refuses("m", "/slots/0?action=save")
    args = kv.launch_args("m", base, swa=True, files=False)  # its preset: kv-store = off
    assert args == [*base, "--no-cache-idle-slots", "--cache-ram", "0"]
    assert not kv.refuses("m", "/slots/0?action=save")
    single, _ = service(tmp_path / "one", private=False)
    assert single.launch_args("m", base, swa=True, files=False) == base
