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
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import trio

from troupe.child.protocol import EXIT_COMMAND

__all__ = ["kill_group", "placed", "spawn_child", "stop_child", "to_background"]

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
    grandchildren), on ``cpus`` from its first instruction. No PR_SET_PDEATHSIG: Trio
    spawns from a worker thread whose exit would kill the child (ARCHITECTURE.md,
    principle 7)."""
    return await trio.lowlevel.open_process(
        list(argv),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(env),
        cwd=cwd,
        start_new_session=True,
        preexec_fn=placed(cpus),
    )


def placed(cpus: Sequence[int] | None) -> Callable[[], None] | None:
    """What runs in the forked child before ``exec``: keep it on ``cpus``.

    Set before ``exec``, so every thread the engine starts inherits it. Pinning the pid
    after the spawn raced the engine's own threads: those started before the pin kept
    every CPU (a child with ``--threads 1`` seen on two cores). Only system calls run
    there (no lock another thread could hold at the fork); a CPU set the kernel refuses
    leaves the child where it is."""
    if cpus is None:
        return None
    wanted = list(cpus)

    def place() -> None:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, wanted)

    return place


def to_background(pid: int, cpus: Sequence[int]) -> None:
    """Put a running process on ``cpus`` at idle priority (SCHED_IDLE: a CPU only when
    nothing else wants one): each thread it has (its first one first: the threads it
    starts after inherit from it). For short background work (a measurement), spawned
    without Python code between fork and exec, which a spawn from a threaded process
    cannot make safe. A thread or setting the kernel refuses is left as it is."""
    tasks = f"/proc/{pid}/task"
    seen: set[int] = set()
    for _ in range(2):  # again for any thread started while the first pass ran
        try:
            tids = [pid, *sorted(int(t) for t in os.listdir(tasks) if int(t) != pid)]
        except OSError:
            return  # gone already
        for tid in tids:
            if tid in seen:
                continue
            seen.add(tid)
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, list(cpus))
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
