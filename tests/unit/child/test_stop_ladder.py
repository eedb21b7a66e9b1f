"""The stop ladder on real processes: exit command, SIGTERM, SIGKILL, in that order."""

from __future__ import annotations

import sys

import trio

from troupe.child.process import spawn_child, stop_child

# llama-server's stdin watcher reads one command and ends; one that lands just before its
# main loop starts is lost. It still shuts down gracefully (exit 0) on SIGTERM.
LOSES_THE_COMMAND = (
    "import signal, sys, time; "
    "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0)); "
    "sys.stdin.readline(); time.sleep(60)"
)
DEAF = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
POLITE = "import sys; sys.stdin.readline(); sys.exit(0)"


async def run(code: str, *, stop_timeout: float, term_grace: float) -> tuple[str, int | None]:
    proc = await spawn_child([sys.executable, "-c", code], {})
    stage = await stop_child(proc, kill=False, stop_timeout=stop_timeout, term_grace=term_grace)
    return stage, proc.returncode


async def test_a_polite_child_exits_on_the_command() -> None:
    assert await run(POLITE, stop_timeout=5, term_grace=5) == ("exit", 0)


async def test_a_lost_exit_command_is_followed_by_a_graceful_sigterm() -> None:
    with trio.fail_after(5):  # well before stop-timeout would bring the forced stages
        assert await run(LOSES_THE_COMMAND, stop_timeout=10, term_grace=5) == ("nudge", 0)


async def test_a_child_deaf_to_everything_is_killed() -> None:
    stage, code = await run(DEAF, stop_timeout=0.2, term_grace=0.2)
    assert stage == "SIGKILL"
    assert code == -9


async def test_kill_is_at_once() -> None:
    proc = await spawn_child([sys.executable, "-c", DEAF], {})
    assert await stop_child(proc, kill=True, stop_timeout=60, term_grace=60) == "SIGKILL"
