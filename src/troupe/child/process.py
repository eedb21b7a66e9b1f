"""Starting a child in its own session, and the stop ladder that always finishes.

The ladder (ARCHITECTURE.md, principle 6): the exit command on stdin, wait ``stop_timeout``,
SIGTERM to the process group, wait ``term_grace``, SIGKILL to the group. It runs
shielded, so a cancelled caller (shutdown, a client gone) never leaves a child
half-stopped. A model still loading is killed at once: it has no request to finish.

llama-server can lose the exit command: its stdin watcher starts just before its
main loop, reads ONE command and ends; a command that lands before the loop has
started is undone by the loop's start (it sets ``running = true`` again), and the
watcher is gone, so sending it again never helps (measured: one swap in 16 took the
whole 10 s stop-timeout). SIGTERM runs the same graceful shutdown through a signal
handler that is always there, so a child that has not gone ``EXIT_NUDGE`` after the
command gets one SIGTERM, still within ``stop_timeout``. A second SIGTERM would make
llama-server exit at once ("terminating immediately"), which is the next rung.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

import trio

from troupe.child.protocol import EXIT_COMMAND

__all__ = ["kill_group", "pin", "spawn_child", "stop_child"]

log = logging.getLogger(__name__)

EXIT_NUDGE = 0.25  # seconds after the exit command before the graceful SIGTERM


async def spawn_child(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: Path | None = None,
    *,
    cpus: Sequence[int] | None = None,
) -> trio.Process:
    """Start ``argv`` with piped stdio, leading a new session (so a group kill reaches
    grandchildren), then pinned on ``cpus`` (`pin`). No PR_SET_PDEATHSIG: Trio spawns
    from a worker thread whose exit would kill the child (ARCHITECTURE.md, principle 7)."""
    proc = await trio.lowlevel.open_process(
        list(argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
    )
    if cpus is not None:
        pin(proc.pid, cpus)
    return proc


def pin(pid: int, cpus: Sequence[int], *, idle: bool = False) -> None:
    """Put a running process on ``cpus`` (and, when ``idle``, at idle priority:
    SCHED_IDLE, a CPU only when nothing else wants one): each thread it has, its first
    one first (threads start with their starter's mask and policy), passes over
    ``/proc/PID/task`` until one finds no thread it has not set.

    From outside, once it runs: troupe's threads (an SSL handshake, a download) hold
    locks a fork copies, and Python code between fork and exec (``preexec_fn``) could
    take one: the at-fork handlers freed a thread's SSL context in a forked copy of the
    test process, which spun on OpenSSL's lock for ever (its spawner waited on it). The
    spawn returns once the engine has exec'd, before its loader and ``main`` start
    threads; a thread started before the first pass is found by it. A thread or setting
    the kernel refuses is left as it is."""
    wanted = list(cpus)
    tasks = f"/proc/{pid}/task"
    seen: set[int] = set()
    for _ in range(8):  # bounded: an engine starts its threads once
        try:
            found = {int(t) for t in os.listdir(tasks)}
        except OSError:
            return  # gone already
        new = sorted(found - seen, key=lambda tid: tid != pid)
        if not new:
            return
        for tid in new:
            seen.add(tid)
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, wanted)
            if idle:
                with contextlib.suppress(OSError, AttributeError):
                    os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal the child's whole process group; a group already gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


async def _send_exit_command(proc: trio.Process) -> None:
    if proc.stdin is None:
        return
    with (
        trio.move_on_after(1),
        contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError),
    ):
        await proc.stdin.send_all(EXIT_COMMAND)


async def stop_child(
    proc: trio.Process, *, kill: bool, stop_timeout: float, term_grace: float
) -> str:
    """Stop ``proc``; returns the stage that ended it: "exited" (already), "exit" (the
    command), "nudge" (the graceful SIGTERM), "SIGTERM", "SIGKILL"."""
    stage = "exited"
    with trio.CancelScope(shield=True):
        stage = await _ladder(proc, kill=kill, stop_timeout=stop_timeout, term_grace=term_grace)
    return stage


async def _ladder(proc: trio.Process, *, kill: bool, stop_timeout: float, term_grace: float) -> str:
    if proc.returncode is not None:
        return "exited"
    if kill:
        kill_group(proc.pid, signal.SIGKILL)
        await proc.wait()
        return "SIGKILL"
    deadline = trio.current_time() + stop_timeout
    await _send_exit_command(proc)
    if await _wait_for(proc, min(EXIT_NUDGE, stop_timeout)):
        return "exit"
    if stop_timeout > EXIT_NUDGE:
        log.info("child pid=%d still up after the exit command: graceful SIGTERM", proc.pid)
        kill_group(proc.pid, signal.SIGTERM)
        if await _wait_for(proc, max(0.0, deadline - trio.current_time())):
            return "nudge"
    log.warning("child pid=%d still up %gs after the exit command: SIGTERM", proc.pid, stop_timeout)
    kill_group(proc.pid, signal.SIGTERM)
    if await _wait_for(proc, term_grace):
        return "SIGTERM"
    log.warning("child pid=%d ignored SIGTERM for %gs: SIGKILL", proc.pid, term_grace)
    kill_group(proc.pid, signal.SIGKILL)
    await proc.wait()
    return "SIGKILL"


async def _wait_for(proc: trio.Process, seconds: float) -> bool:
    """Did ``proc`` exit within ``seconds``?"""
    with trio.move_on_after(seconds):
        await proc.wait()
    return proc.returncode is not None
