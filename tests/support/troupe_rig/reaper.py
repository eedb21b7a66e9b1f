"""The rig's processes die with the process that started them, even a SIGKILLed one.

A pytest or a bench killed outright (SIGKILL, a CI job's timeout, an OOM kill) runs no
``finally``: HAProxy, nginx, ``troupe serve`` and the engines they or the rig started
lived on, each in a session of its own. ``PR_SET_PDEATHSIG`` cannot help here: Trio
starts processes from a worker thread, and the signal is sent when that *thread* ends
(an idle worker ends after seconds), not the process.

So each process that uses the rig gets one watchdog: ``python -m troupe_rig.reaper``,
in a session of its own, reading a pipe whose only writer is its owner. Every process
the rig starts is told to it (``guard``), and every state directory of a router that
runs inside the owner (``guard_state_dir``: its children are in troupe's PID ledger).
When the pipe ends (the owner exited, however it did), the watchdog sends SIGTERM to
each guarded process that is still the same process (pid and start time), lets a
``troupe serve`` stop its children, SIGKILLs what is left (its process group where it
leads one), then kills the children in the PID ledgers of the owner's routers and of
the guarded ``troupe serve``\\ s (as `troupe.child.ledger.reap_orphans` does at a start).
An owner that exits normally has stopped everything already: the watchdog then finds
nothing alive and exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

__all__ = ["guard", "guard_state_dir", "watchdog_pid"]

GRACE = 10.0  # seconds a guarded process has after SIGTERM (troupe stops its children)
_ROOT = Path(__file__).resolve().parents[1]  # the directory that holds troupe_rig

_lock = threading.Lock()
_pipe = -1  # the write end of the watchdog's stdin (a bare descriptor: nothing to close)
_owner = 0  # the pid that started the watchdog (a forked child needs its own)
_watchdog = 0


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat), or None."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()
    return int(fields[19])  # field 22 of stat; the comm before ")" may hold spaces


def _send(line: str) -> None:
    global _pipe, _owner, _watchdog  # noqa: PLW0603 (one watchdog per process)
    with _lock:
        if _pipe < 0 or _owner != os.getpid():
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), env.get("PYTHONPATH")]))
            read, write = os.pipe()  # neither inherited by any other child (close-on-exec)
            argv = [sys.executable, "-m", "troupe_rig.reaper", str(os.getpid())]
            actions = [
                (os.POSIX_SPAWN_DUP2, read, 0),
                (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
            ]
            # In a session of its own: a kill of the owner's group leaves it to act.
            _watchdog = os.posix_spawn(sys.executable, argv, env, file_actions=actions, setsid=True)
            os.close(read)
            _pipe, _owner = write, os.getpid()
        with contextlib.suppress(OSError):  # a watchdog gone cannot be helped
            os.write(_pipe, line.encode() + b"\n")


def guard(pid: int, state_dir: Path | None = None) -> None:
    """Stop process ``pid`` (with its process group where it leads one) once this
    process is gone; ``state_dir``: its troupe's ledger, reaped after it is stopped."""
    started = _start_time(pid)
    if started is None:
        return  # already gone
    _send(f"pid {pid} {started}")
    if state_dir is not None:
        guard_state_dir(state_dir)


def guard_state_dir(state_dir: Path) -> None:
    """Reap the ledger in ``state_dir`` once this process is gone: the children of a
    troupe router that ran in it (or in a guarded process)."""
    _send(f"dir {Path(state_dir).resolve()}")


def watchdog_pid() -> int | None:
    """This process's watchdog, if one was started."""
    return _watchdog if _watchdog and _owner == os.getpid() else None


# ----- the watchdog ------------------------------------------------------------------


def _signal(pid: int, started: int, sig: int) -> bool:
    """``sig`` to the process (its group where it leads one) if it is still the one
    that was guarded; whether it was."""
    if _start_time(pid) != started:
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        try:
            leads = os.getpgid(pid) == pid
        except ProcessLookupError:
            return False
        if leads:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    return True


def _alive(pid: int, started: int) -> bool:
    if _start_time(pid) != started:
        return False
    with contextlib.suppress(OSError):
        state = Path(f"/proc/{pid}/stat").read_bytes()
        return state[state.rindex(b")") + 2 : state.rindex(b")") + 3] != b"Z"
    return False


def main(argv: list[str]) -> int:
    owner = int(argv[1]) if len(argv) > 1 else os.getppid()
    procs: dict[int, int] = {}
    dirs: list[str] = []
    for raw in sys.stdin.buffer:
        kind, _, rest = raw.decode(errors="replace").rstrip("\n").partition(" ")
        if kind == "pid":
            pid, started = rest.split()
            procs[int(pid)] = int(started)
        elif kind == "dir" and rest not in dirs:
            dirs.append(rest)
    # The pipe ended: the owner is exiting or gone. Wait for it to be gone (its ledger
    # is reaped only once its owner is dead), briefly: a normal exit is quick.
    deadline = time.monotonic() + GRACE
    while Path(f"/proc/{owner}").exists() and time.monotonic() < deadline:
        stat = Path(f"/proc/{owner}/stat")
        with contextlib.suppress(OSError):
            if stat.read_bytes().split(b") ", 1)[1][:1] == b"Z":
                break  # a zombie: dead, its parent has not reaped it yet
        time.sleep(0.05)
    live = {pid: st for pid, st in procs.items() if _signal(pid, st, signal.SIGTERM)}
    deadline = time.monotonic() + GRACE
    while any(_alive(p, s) for p, s in live.items()) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid, started in live.items():
        _signal(pid, started, signal.SIGKILL)
    deadline = time.monotonic() + GRACE
    while any(_alive(p, s) for p, s in live.items()) and time.monotonic() < deadline:
        time.sleep(0.05)
    for directory in dirs:
        _reap_ledgers(Path(directory))
    return 0


def _reap_ledgers(state_dir: Path) -> None:
    """Kill the children listed in troupe's PID ledgers (troupe.child.ledger's format)
    whose troupe is dead, a zombie included (`reap_orphans` takes a zombie for alive:
    an owner whose parent died may stay one where nothing reaps it)."""
    import psutil  # noqa: PLC0415 (only at the end)

    def created(pid: int) -> float | None:
        try:
            proc = psutil.Process(pid)
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            return round(float(proc.create_time()), 2)
        except psutil.Error:
            return None

    for path in sorted(state_dir.glob("children-*.json")):
        try:
            data = json.loads(path.read_text())
            if created(int(data["owner"]["pid"])) == data["owner"].get("create_time"):
                continue  # its troupe is alive
            children = [(int(c["pid"]), c.get("create_time")) for c in data["children"]]
        except (OSError, ValueError, KeyError, TypeError):
            continue
        for pid, create_time in children:
            if created(pid) == create_time:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)  # troupe's children lead their group


if __name__ == "__main__":
    sys.exit(main(sys.argv))
