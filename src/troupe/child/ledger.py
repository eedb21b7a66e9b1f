"""The PID ledger: which children this troupe started, so a later troupe can reap them.

A child's own stdin watcher starts only after its model loaded, so a troupe killed
with SIGKILL during a load leaves an orphan. Each troupe process writes one ledger
file (its own pid and create time, then one entry per live child); at start-up,
files whose owner is dead are reaped: each listed child that still matches both pid
and create time has its process group killed. Files of live troupes are left alone,
so several troupes on one machine (and parallel tests) never touch each other.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
from pathlib import Path

import psutil

__all__ = ["PidLedger", "default_state_dir", "reap_orphans"]

log = logging.getLogger(__name__)


def default_state_dir() -> Path:
    env = os.environ.get("TROUPE_STATE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "troupe"


def _create_time(pid: int) -> float | None:
    try:
        return round(float(psutil.Process(pid).create_time()), 2)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


class PidLedger:
    """This process's ledger file. An addition is written synchronously, on purpose:
    the entry must be on disk before anything else can happen to this troupe. A removal
    may be written from a worker thread (a stale entry is harmless), hence the lock."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.path = state_dir / f"children-{os.getpid()}.json"
        self._children: dict[int, tuple[float, str]] = {}
        self._owner = (os.getpid(), _create_time(os.getpid()))
        self._lock = threading.Lock()

    def add(self, pid: int, model: str) -> None:
        ct = _create_time(pid)
        if ct is not None:
            with self._lock:
                self._children[pid] = (ct, model)
                self._write()

    def remove(self, pid: int) -> None:
        with self._lock:
            if self._children.pop(pid, None) is not None:
                self._write()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()

    def _write(self) -> None:
        data = {
            "owner": {"pid": self._owner[0], "create_time": self._owner[1]},
            "children": [
                {"pid": pid, "create_time": ct, "model": model}
                for pid, (ct, model) in self._children.items()
            ],
        }
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data))
            tmp.replace(self.path)
        except OSError as exc:  # a read-only state dir costs only orphan reaping
            log.warning("cannot write the PID ledger %s: %s", self.path, exc)


def reap_orphans(state_dir: Path) -> list[int]:
    """Kill the children of dead troupes listed in ``state_dir``; returns their pids."""
    killed: list[int] = []
    try:
        files = sorted(state_dir.glob("children-*.json"))
    except OSError:
        return killed
    for path in files:
        try:
            data = json.loads(path.read_text())
            owner = data["owner"]
            children = data["children"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if _create_time(int(owner["pid"])) == owner.get("create_time"):
            continue  # its troupe is alive
        for child in children:
            pid = int(child["pid"])
            if _create_time(pid) != child.get("create_time"):
                continue  # gone, or the pid was reused by an unrelated process
            log.warning("killing orphaned child pid=%d of model %s", pid, child.get("model"))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)  # children lead their own process group
            killed.append(pid)
        with contextlib.suppress(OSError):
            path.unlink()
    return killed
