"""The KV store's files and index without an engine: slot files written the way the
pinned engine writes them (``ggsq``, version, the server's token list, then cells)."""

from __future__ import annotations

import struct
from pathlib import Path

from troupe.kvstore import KvEntry, KvService, KvStore, kv_identity
from troupe.kvstore.slotfile import SLOT_MAGIC, read_tokens
from troupe.kvstore.store import describe, write_sidecar
from troupe.proxy.upstream import UpstreamPool


def slot_file(path: Path, tokens: list[int], cells: int = 1000) -> Path:
    values = [-1, 1, len(tokens), *tokens, 0]
    head = struct.pack("<III", SLOT_MAGIC, 4, len(values))
    path.write_bytes(head + struct.pack(f"<{len(values)}i", *values) + b"\x07" * cells)
    return path


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 1
        return self.now


def saved(store: KvStore, ident: str, tokens: list[int], cells: int = 1000) -> KvEntry:
    """What a save does once the engine wrote its file."""
    name = store.new_name()
    path = slot_file(store.slot_dir(ident) / f"{name}.bin", tokens, cells)
    described = describe(path)
    assert described is not None
    toks, digest, size = described
    entry = KvEntry(ident, name, "m", toks, digest, size, 0.0)
    store.touch(entry)
    write_sidecar(entry, store.root)
    store.add(entry)
    return entry


def test_the_tokens_are_read_from_the_engines_file_and_junk_is_refused(tmp_path: Path) -> None:
    assert read_tokens(slot_file(tmp_path / "a.bin", [2, 10, 11])) == [2, 10, 11]
    (tmp_path / "junk.bin").write_bytes(b"not a slot file at all")
    assert read_tokens(tmp_path / "junk.bin") is None
    short = slot_file(tmp_path / "short.bin", list(range(100)), cells=0)
    short.write_bytes(short.read_bytes()[:40])
    assert read_tokens(short) is None


def test_entries_survive_a_reopen_and_a_file_without_sidecar_is_deleted(tmp_path: Path) -> None:
    store = KvStore(tmp_path, 1 << 30, Clock())
    entry = saved(store, "id1", list(range(300)))
    # A child killed mid-save: its file, no sidecar.
    orphan = slot_file(store.slot_dir("id1") / "half.bin", list(range(50)))
    again = KvStore(tmp_path, 1 << 30)
    again.open()
    assert [e.name for e in again.entries()] == [entry.name]
    assert again.entries()[0].tokens == tuple(range(300))
    assert not orphan.exists()


def test_a_truncated_entry_is_dropped_on_open(tmp_path: Path) -> None:
    store = KvStore(tmp_path, 1 << 30, Clock())
    entry = saved(store, "id1", list(range(300)))
    path = store.file(entry)
    path.write_bytes(path.read_bytes()[:-10])
    again = KvStore(tmp_path, 1 << 30)
    again.open()
    assert again.entries() == []
    assert not path.exists()


def test_the_least_recently_used_go_when_over_budget(tmp_path: Path) -> None:
    clock = Clock()
    one = 12 + 4 * 304 + 1000
    store = KvStore(tmp_path, 2 * one + 10, clock)
    a = saved(store, "id1", [1, *range(300)])
    b = saved(store, "id1", [2, *range(300)])
    store.touch(a)  # a used after b
    saved(store, "id1", [3, *range(300)])
    names = {e.name for e in store.entries()}
    assert a.name in names
    assert b.name not in names
    assert not store.file(b).exists()
    assert store.total_bytes <= store.budget


def test_a_longer_save_of_the_same_conversation_replaces_the_shorter(tmp_path: Path) -> None:
    store = KvStore(tmp_path, 1 << 30, Clock())
    short = saved(store, "id1", list(range(300)))
    other = saved(store, "id1", [9, *range(300)])
    longer = saved(store, "id1", list(range(400)))
    assert {e.name for e in store.entries()} == {other.name, longer.name}
    assert not store.file(short).exists()


def test_the_longest_shared_prefix_wins_and_identities_never_mix(tmp_path: Path) -> None:
    store = KvStore(tmp_path, 1 << 30, Clock())
    near = saved(store, "id1", [*range(200), 7, 7])
    saved(store, "id1", [*range(100), 5])
    saved(store, "id2", list(range(300)))  # a longer match, of another layout
    found = store.best_match("id1", [*range(250)])
    assert found is not None
    assert found[0].name == near.name
    assert found[1] == 200
    assert store.best_match("id1", [*range(250)], exclude=[near.name]) is not None
    assert store.best_match("id3", [*range(250)]) is None


def test_an_entry_of_a_changed_model_is_dropped(tmp_path: Path) -> None:
    store = KvStore(tmp_path, 1 << 30, Clock())
    saved(store, "old", list(range(300)))
    assert store.drop_model("m", keep_ident="new") == 1
    assert store.usage("m") == (0, 0)


def test_the_identity_ignores_where_a_child_runs_but_not_what_its_cache_holds(
    tmp_path: Path,
) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    base = ["llama-server", "--model", str(model), "--ctx-size", "4096"]
    ident = kv_identity([*base, "--port", "1234", "--threads", "2", "--cpu-range", "0-1"])
    assert ident == kv_identity([*base, "--port", "999", "--threads=8", "--alias", "x"])
    assert ident != kv_identity([*base, "--cache-type-k", "q8_0"])
    assert ident != kv_identity([*base[:-1], "2048"])
    assert ident != kv_identity([*base, "--swa-full"])
    model.write_bytes(b"GGUF but changed")
    assert ident != kv_identity(base)


def test_a_child_with_its_own_slot_path_is_left_to_its_user(tmp_path: Path) -> None:
    kv = KvService(KvStore(tmp_path / "kv", 1 << 30), children=UpstreamPool())
    own = ["llama-server", "--model", "m.gguf", "--slot-save-path", "/srv/mine"]
    assert kv.launch_args("m", own, swa=True) == own  # no second path, no --swa-full
    assert not kv.refuses("m", "/slots/0")
    ours = kv.launch_args("n", ["llama-server", "--model", "n.gguf"], swa=True)
    assert ours[-2:] == ["--slot-save-path", str(tmp_path / "kv" / kv_identity(ours[:-2]))]
    assert "--swa-full" in ours
    assert "--no-cache-idle-slots" in ours  # idle slots keep their conversations
    # Where idle slots wait is not part of the layout: a preset that asks for the
    # engine's RAM cache keeps it, and its entries.
    asked = kv.launch_args("n", ["llama-server", "--model", "n.gguf", "--cache-idle-slots"], True)
    assert "--no-cache-idle-slots" not in asked
    assert asked[-1] == ours[-1]
    assert kv.refuses("n", "/slots/0")  # any action: the engine's reading of it is its own
    assert not kv.refuses("n", "/slots")
