"""The KV store's files and index: ``ROOT/IDENTITY/NAME.bin`` (the engine's slot file)
beside ``NAME.json`` (its sidecar: model, tokens, sha256, size, last use).

An entry exists only once its sidecar does, and the sidecar is written (atomically)
after the engine's save returned and the file was checksummed: a child killed mid-save
leaves a slot file without a sidecar, which `KvStore.open` deletes. The index is
mutated on the event loop only; the file work (`checksum`, `describe`, `write_sidecar`)
is plain functions for worker threads.

An entry belongs to a tenant (the API key's name when there are several, else ""): a
lookup finds only its own tenant's. The files hold a conversation's tokens in plain
text: the directories are 0700 and the files 0600 (the engine writes slot files with its
own umask: `describe` fixes their mode; `KvStore.open` fixes what is already there).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

import attrs

from troupe.kvstore.slotfile import read_tokens

__all__ = ["KvEntry", "KvStore", "checksum", "describe", "private_dir"]

log = logging.getLogger("troupe.kvstore")


@attrs.define
class KvEntry:
    ident: str  # the KV identity of the children it fits
    name: str  # file stem
    model: str
    tokens: tuple[int, ...]
    sha256: str
    size: int
    last_used: float
    tenant: str = ""  # whose conversation it is (an API key's name; "": one tenant)

    def to_json(self) -> dict[str, object]:
        return {
            "model": self.model,
            "tokens": list(self.tokens),
            "sha256": self.sha256,
            "size": self.size,
            "last_used": self.last_used,
            "tenant": self.tenant,
        }


DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """``path`` made (with its parents) and readable by this user only."""
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o777 != DIR_MODE:
        os.chmod(path, DIR_MODE)
    return path


def checksum(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def describe(path: Path) -> tuple[tuple[int, ...], str, int] | None:
    """A freshly saved slot file's tokens, checksum and size (None: not a slot file);
    the file made readable by this user only."""
    os.chmod(path, FILE_MODE)
    tokens = read_tokens(path)
    if tokens is None:
        return None
    return tuple(tokens), checksum(path), path.stat().st_size


def write_sidecar(entry: KvEntry, root: Path) -> None:
    final = root / entry.ident / f"{entry.name}.json"
    tmp = final.with_suffix(".json.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    with os.fdopen(fd, "w") as f:
        os.fchmod(fd, FILE_MODE)  # an older .tmp keeps its mode through O_CREAT
        f.write(json.dumps(entry.to_json()))
    os.replace(tmp, final)


def common_prefix(a: tuple[int, ...], b: list[int] | tuple[int, ...]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class KvStore:
    """Every entry under ``root``, bounded by ``budget`` bytes (least recently used go)."""

    def __init__(self, root: Path, budget: int, clock: Callable[[], float] = time.time) -> None:
        self.root = root
        self.budget = budget
        self._clock = clock
        self._entries: dict[tuple[str, str], KvEntry] = {}

    # ----- reading -------------------------------------------------------------------------

    def open(self) -> None:
        """Read the index from disk (a troupe restart keeps its entries); drop what a
        killed save or a broken sidecar left; make every directory 0700, every file 0600."""
        try:
            private_dir(self.root)
            dirs = [d for d in self.root.iterdir() if d.is_dir()]
        except OSError:
            dirs = []
        for d in dirs:
            with contextlib.suppress(OSError):
                os.chmod(d, DIR_MODE)
            for path in sorted(d.iterdir()):
                with contextlib.suppress(OSError):
                    if path.is_file() and path.stat().st_mode & 0o777 != FILE_MODE:
                        os.chmod(path, FILE_MODE)
                if path.suffix == ".tmp" or path.name.endswith(".json.tmp"):
                    path.unlink(missing_ok=True)
                elif path.suffix == ".json":
                    self._load(d.name, path)
            for path in d.glob("*.bin"):
                if (d.name, path.stem) not in self._entries:
                    log.info("dropping %s: no sidecar (a save that did not finish)", path)
                    path.unlink(missing_ok=True)
        self._enforce_budget()

    def _load(self, ident: str, sidecar: Path) -> None:
        try:
            raw = json.loads(sidecar.read_text())
            entry = KvEntry(
                ident=ident,
                name=sidecar.stem,
                model=str(raw["model"]),
                tokens=tuple(int(t) for t in raw["tokens"]),
                sha256=str(raw["sha256"]),
                size=int(raw["size"]),
                last_used=float(raw["last_used"]),
                tenant=str(raw.get("tenant", "")),
            )
            size = sidecar.with_suffix(".bin").stat().st_size
        except (OSError, ValueError, KeyError, TypeError):
            log.warning("dropping the KV entry %s: unreadable", sidecar)
            self._remove_files(ident, sidecar.stem)
            return
        if size != entry.size:
            log.warning("dropping the KV entry %s: truncated", sidecar)
            self._remove_files(ident, sidecar.stem)
            return
        self._entries[(ident, entry.name)] = entry

    def entries(self, ident: str | None = None) -> list[KvEntry]:
        return [e for e in self._entries.values() if ident is None or e.ident == ident]

    def usage(self, model: str) -> tuple[int, int]:
        """``model``'s entries and their bytes."""
        mine = [e for e in self._entries.values() if e.model == model]
        return len(mine), sum(e.size for e in mine)

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self._entries.values())

    def best_match(
        self, ident: str, tokens: list[int], exclude: Iterable[str] = (), *, tenant: str = ""
    ) -> tuple[KvEntry, int] | None:
        """The entry of ``ident`` and ``tenant`` sharing the longest prefix with ``tokens``."""
        skip = set(exclude)
        best: tuple[KvEntry, int] | None = None
        for e in self._entries.values():
            if e.ident != ident or e.tenant != tenant or e.name in skip:
                continue
            n = common_prefix(e.tokens, tokens)
            if n and (best is None or n > best[1]):
                best = (e, n)
        return best

    # ----- writing -------------------------------------------------------------------------

    def slot_dir(self, ident: str) -> Path:
        """Where a child of ``ident`` saves its slots (its ``--slot-save-path``)."""
        private_dir(self.root)
        return private_dir(self.root / ident)

    @staticmethod
    def new_name() -> str:
        return uuid.uuid4().hex

    def file(self, entry: KvEntry) -> Path:
        return self.root / entry.ident / f"{entry.name}.bin"

    def add(self, entry: KvEntry) -> list[KvEntry]:
        """Index ``entry`` (its sidecar written); returns the entries it displaced: those
        it extends (the same conversation, saved earlier) and the LRU ones over budget."""
        gone = [
            e
            for e in self._entries.values()
            if e.ident == entry.ident
            and e.tenant == entry.tenant
            and len(e.tokens) <= len(entry.tokens)
            and entry.tokens[: len(e.tokens)] == e.tokens
        ]
        for e in gone:
            self.drop(e)
        self._entries[(entry.ident, entry.name)] = entry
        return gone + self._enforce_budget()

    def touch(self, entry: KvEntry) -> None:
        entry.last_used = self._clock()

    def drop(self, entry: KvEntry) -> None:
        self._entries.pop((entry.ident, entry.name), None)
        self._remove_files(entry.ident, entry.name)

    def drop_model(self, model: str, keep_ident: str | None = None) -> int:
        """Drop ``model``'s entries not of ``keep_ident`` (its files or arguments
        changed, or it left the catalog); returns how many."""
        stale = [e for e in self._entries.values() if e.model == model and e.ident != keep_ident]
        for e in stale:
            self.drop(e)
        return len(stale)

    def drop_unknown(self, models: Iterable[str]) -> int:
        known = set(models)
        stale = [e for e in self._entries.values() if e.model not in known]
        for e in stale:
            self.drop(e)
        return len(stale)

    def _enforce_budget(self) -> list[KvEntry]:
        gone: list[KvEntry] = []
        by_age = sorted(self._entries.values(), key=lambda e: e.last_used)
        total = sum(e.size for e in by_age)
        for e in by_age:
            if total <= self.budget:
                break
            total -= e.size
            self.drop(e)
            gone.append(e)
        return gone

    def _remove_files(self, ident: str, name: str) -> None:
        d = self.root / ident
        # The directory stays: it may be a running child's --slot-save-path.
        for suffix in (".bin", ".json"):
            (d / f"{name}{suffix}").unlink(missing_ok=True)
