"""The unfinished-downloads journal: ``<state dir>/downloads.json``.

A download is written here (with its whole plan: commit and files) before its first
byte, and removed when it finished, failed or was cancelled. What is left at start-up
was cut short by a stop or a crash: the router resumes its own entries (``origin
"router"``) from the plan they recorded, ``troupe pull`` resumes its entry for the
same name, and `Journal.clean` drops entries that no longer make sense. Resuming from
the recorded commit, not from the branch's current head, keeps the partial files valid:
``resolve/<commit>/...`` never changes.

Several processes may share a state dir (a router and a ``pull``): every change is a
read-modify-write of the whole (small) file under an ``flock`` on ``downloads.lock``,
replaced atomically.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from troupe.download.plan import DownloadPlan, PlannedFile

__all__ = ["Journal", "JournalEntry", "plan_from_json", "plan_to_json"]

log = logging.getLogger("troupe.download")

_VERSION = 1


@attrs.frozen
class JournalEntry:
    plan: DownloadPlan
    origin: str  # "router" or "pull"
    started: float  # unix time
    cache: str  # the hub cache directory it downloads into


def plan_to_json(plan: DownloadPlan) -> dict[str, Any]:
    return {
        "name": plan.name,
        "repo": plan.repo,
        "tag": plan.tag,
        "branch": plan.branch,
        "commit": plan.commit,
        "files": [attrs.asdict(f) for f in plan.files],
    }


def plan_from_json(data: Any) -> DownloadPlan:
    """Raises KeyError/TypeError/ValueError on anything malformed."""
    files = tuple(
        PlannedFile(
            path=str(f["path"]),
            size=int(f["size"]),
            oid=str(f["oid"]),
            sha256=None if f["sha256"] is None else str(f["sha256"]),
            git_oid=str(f["git_oid"]),
            role=str(f["role"]),
        )
        for f in data["files"]
    )
    if not files:
        raise ValueError("a plan without files")
    return DownloadPlan(
        name=str(data["name"]),
        repo=str(data["repo"]),
        tag=str(data["tag"]),
        branch=str(data["branch"]),
        commit=str(data["commit"]),
        files=files,
    )


class Journal:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "downloads.json"
        self._lock_path = state_dir / "downloads.lock"

    @contextlib.contextmanager
    def _locked(self) -> Iterator[dict[str, Any]]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self._lock_path, "a") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            entries = self._read()
            before = json.dumps(entries, sort_keys=True)
            yield entries
            if json.dumps(entries, sort_keys=True) != before:
                tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
                tmp.write_text(json.dumps({"version": _VERSION, "downloads": entries}, indent=1))
                os.replace(tmp, self.path)

    def _read(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            log.warning("ignoring an unreadable download journal %s: %s", self.path, exc)
            return {}
        entries = data.get("downloads") if isinstance(data, dict) else None
        return entries if isinstance(entries, dict) else {}

    def add(self, plan: DownloadPlan, origin: str, cache: Path) -> None:
        with self._locked() as entries:
            entries[plan.name] = {
                "plan": plan_to_json(plan),
                "origin": origin,
                "started": time.time(),
                "cache": str(cache),
            }

    def remove(self, name: str) -> None:
        with self._locked() as entries:
            entries.pop(name, None)

    def entries(self) -> list[JournalEntry]:
        """Every well-formed entry (malformed ones are left to `clean`)."""
        with self._locked() as entries:
            return [e for e in (_entry(v) for v in entries.values()) if e is not None]

    def get(self, name: str) -> JournalEntry | None:
        return next((e for e in self.entries() if e.plan.name == name), None)

    def clean(self) -> list[str]:
        """Drop malformed entries; returns the names dropped."""
        with self._locked() as entries:
            bad = [name for name, value in entries.items() if _entry(value) is None]
            for name in bad:
                entries.pop(name)
        for name in bad:
            log.warning("dropped a malformed download journal entry: %s", name)
        return bad


def _entry(value: Any) -> JournalEntry | None:
    try:
        return JournalEntry(
            plan=plan_from_json(value["plan"]),
            origin=str(value["origin"]),
            started=float(value["started"]),
            cache=str(value["cache"]),
        )
    except (KeyError, TypeError, ValueError):
        return None
