"""The stop ladder on real processes: exit command, SIGTERM, SIGKILL, in that order."""

from __future__ import annotations

import sys

import trio

from troupe.child.process import spawn_child, stop_child

# Exits 0 on the second line it reads: the first exit command is "lost", as llama-server
# can lose one that arrives just as its main loop starts.
DEAF_ONCE = "import sys; sys.stdin.readline(); sys.stdin.readline(); sys.exit(0)"
DEAF = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
POLITE = "import sys; sys.stdin.readline(); sys.exit(0)"


async def run(code: str, *, stop_timeout: float, term_grace: float) -> tuple[str, int | None]:
    proc = await spawn_child([sys.executable, "-c", code], {})
    stage = await stop_child(proc, kill=False, stop_timeout=stop_timeout, term_grace=term_grace)
    return stage, proc.returncode


async def test_a_polite_child_exits_on_the_command() -> None:
    assert await run(POLITE, stop_timeout=5, term_grace=5) == ("exit", 0)


async def test_a_lost_exit_command_is_sent_again() -> None:
    with trio.fail_after(4):  # well before stop-timeout would bring SIGTERM
        assert await run(DEAF_ONCE, stop_timeout=10, term_grace=5) == ("exit", 0)


async def test_a_child_deaf_to_everything_is_killed() -> None:
    stage, code = await run(DEAF, stop_timeout=0.2, term_grace=0.2)
    assert stage == "SIGKILL"
    assert code == -9


async def test_kill_is_at_once() -> None:
    proc = await spawn_child([sys.executable, "-c", DEAF], {})
    assert await stop_child(proc, kill=True, stop_timeout=60, term_grace=60) == "SIGKILL"
