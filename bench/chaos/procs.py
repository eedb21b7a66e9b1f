"""Processes seen from outside: descendants, descriptors, memory, orphans, signals.

Every router the harness starts carries ``CHAOS_TAG=<tag>`` in its environment, and
both routers pass their environment on to their children, so a process that escaped
the router's tree (re-parented to init after a crash, say) is still found by its tag.
The `Tracker` also samples the router's tree every few milliseconds, so "every
descendant the router ever had" is known, with when it appeared and when it went.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil
import trio

TAG_VAR = "CHAOS_TAG"
PROC = Path("/proc")


def children_of(pid: int) -> list[int]:
    """Direct children, from /proc/PID/task/*/children (no scan of the whole table)."""
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in (PROC / str(pid) / "task").iterdir():
            with contextlib.suppress(OSError):
                out += [int(p) for p in (task / "children").read_text().split()]
    return out


def descendants(pid: int) -> list[int]:
    found: list[int] = []
    todo = children_of(pid)
    while todo:
        child = todo.pop()
        found.append(child)
        todo += children_of(child)
    return found


def cmdline(pid: int) -> str:
    try:
        raw = (PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def alive(pid: int, created: float | None) -> bool:
    """The same process (pid and start time) still exists and is not a zombie."""
    try:
        proc = psutil.Process(pid)
        return proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def age_s(pid: int) -> float:
    """Seconds since ``pid`` started, to the kernel's tick (psutil's create time is only
    as good as the boot time, a whole second)."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
        uptime = float((PROC / "uptime").read_text().split()[0])
    except OSError:
        return -1.0
    start_ticks = int(stat.rpartition(")")[2].split()[19])
    return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


def fd_count(pid: int) -> int:
    try:
        return len(os.listdir(PROC / str(pid) / "fd"))
    except OSError:
        return -1


def rss_bytes(pid: int) -> int:
    try:
        return int(psutil.Process(pid).memory_info().rss)
    except psutil.Error:
        return -1


def tagged(tag: str, exclude: Iterable[int] = ()) -> list[int]:
    """Live processes whose environment carries this tag (zombies are not processes)."""
    needle = f"{TAG_VAR}={tag}".encode() + b"\0"
    skip = {os.getpid(), *exclude}
    out: list[int] = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "environ").read_bytes() + b"\0":
                with contextlib.suppress(psutil.Error):
                    if psutil.Process(int(entry.name)).status() != psutil.STATUS_ZOMBIE:
                        out.append(int(entry.name))
    return out


@dataclass
class Seen:
    pid: int
    created: float | None
    cmd: str
    first: float  # time.monotonic() when first seen
    last: float  # last time it was seen in the tree
    parent_root: int  # which router it belonged to


class Tracker:
    """Samples the descendants of one or more router processes in a thread."""

    def __init__(self, interval: float = 0.01) -> None:
        self.interval = interval
        self.roots: list[int] = []
        self.seen: dict[int, Seen] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-tracker", daemon=True)

    def start(self, root: int) -> None:
        self.add_root(root)
        self._thread.start()

    def add_root(self, root: int) -> None:
        with self._lock:
            self.roots.append(root)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)

    def sample(self) -> None:
        now = time.monotonic()
        with self._lock:
            roots = list(self.roots)
        for root in roots:
            root_cmd = cmdline(root)
            for pid in descendants(root):
                with self._lock:
                    known = self.seen.get(pid)
                    if known is not None:
                        known.last = now
                        if known.cmd and known.cmd != root_cmd:
                            continue
                # Seen between fork and exec, it still had the router's command line:
                # read it again until it is the child's own.
                if known is not None:
                    with self._lock:
                        known.cmd = cmdline(pid)
                    continue
                created = create_time(pid)
                with self._lock:
                    self.seen[pid] = Seen(pid, created, cmdline(pid), now, now, root)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def all(self) -> list[Seen]:
        with self._lock:
            return list(self.seen.values())

    def spawned(self, match: Callable[[Seen], bool] = lambda s: True) -> int:
        return sum(1 for s in self.all() if match(s))

    def survivors(self) -> list[Seen]:
        """Descendants ever seen that are still alive."""
        return [s for s in self.all() if alive(s.pid, s.created)]


def describe(pids: Iterable[int]) -> str:
    return ", ".join(f"{p} ({cmdline(p)[:60]})" for p in pids)


def catch_child(root: int, needle: str, sig: int, within: float) -> tuple[int, float] | None:
    """Signal the first descendant of ``root`` whose command line contains ``needle``,
    as soon as it appears (polled every half millisecond: a tiny model loads in ~10 ms).
    Returns its pid and its age when signalled (s), or None when none appeared within
    ``within`` seconds."""
    deadline = time.monotonic() + within
    checked: set[int] = set()
    while time.monotonic() < deadline:
        for pid in descendants(root):
            if pid in checked:
                continue
            line = cmdline(pid)
            if not line or line == cmdline(root):
                continue  # forked, not yet exec'd: look again
            checked.add(pid)
            if needle in line:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
                return pid, age_s(pid)
        time.sleep(0.0005)
    return None


async def wait_gone(pid: int, within: float) -> bool:
    """Did ``pid`` exit within ``within`` seconds? Waits on a pidfd (readable once the
    process has exited), so any process can be waited for, not only a child of ours."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        with trio.move_on_after(within):
            await trio.lowlevel.wait_readable(fd)
            return True
        return False
    finally:
        os.close(fd)


def signal_quietly(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def kill_survivors(pids: Iterable[int]) -> None:
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()
