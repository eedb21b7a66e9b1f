"""The instance actor: one child process, its port, its output readers and its stop.

Everything it learns goes to the scheduler as messages tagged with its generation.
It never raises into the scheduler's nursery: a bug in this code, like a crash of
the child, ends as one ``Exited`` message (one_for_one supervision: ARCHITECTURE.md).
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path

import attrs
import trio

from troupe.child.classify import LogKind, classify_line, describe_exit_signal, oom_device
from troupe.child.http_threads import http_threads, parallel_slots
from troupe.child.ledger import PidLedger
from troupe.child.logring import LogRing
from troupe.child.ports import free_port
from troupe.child.process import kill_group, spawn_child, stop_child
from troupe.child.protocol import iter_lines, parse_state_line
from troupe.messages import ChildState, Exited, Message, Spawned
from troupe.modellog import about

__all__ = ["Instance", "LaunchSpec"]

log = logging.getLogger("troupe.instance")
child_log = logging.getLogger("troupe.child")

KNOWN_STATES = frozenset({"loading", "ready", "sleeping", "downloading"})
READER_DRAIN = 2.0  # seconds to read what a dead child left in its pipes
TAIL_LINES = 5  # stderr lines quoted in an error


@attrs.frozen
class LaunchSpec:
    """How to start one model's child: argv for a port, environment, stop timing."""

    model: str
    argv: Callable[[int], Sequence[str]]
    env: Mapping[str, str]
    stop_timeout: float = 10.0
    term_grace: float = 5.0
    cwd: Path | None = None
    # Kill a load whose child prints nothing (no state line, no log line) for this long:
    # a child stopped or hung while loading must not hold its slot and waiters forever.
    load_timeout: float | None = None
    log_sink: Callable[[str], None] | None = None  # each stderr line (the model's log store)
    cpus: tuple[int, ...] | None = None  # its CPU lane: the process's affinity from the start
    # Before a stop that is not a kill (the KV store saves the child's slots, given its
    # generation): bounded by before_stop_seconds, then the stop goes on whatever happened.
    before_stop: Callable[[int], Awaitable[None]] | None = None
    before_stop_seconds: float = 10.0
    # The model's file: a failed load says "no such file" when it is missing (the
    # engine's own line about it is rarely among the last it prints).
    model_file: Path | None = None
    # The engine's device ids (``CUDA1``) -> troupe's names (``cuda:1``): the device a
    # load that ran out of memory names, so the retry frees room there.
    device_names: Mapping[str, str] = attrs.field(factory=dict)


def _describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


class Instance:
    """One child of one model, for one generation."""

    def __init__(
        self,
        spec: LaunchSpec,
        gen: int,
        outbox: trio.MemorySendChannel[Message],
        ledger: PidLedger | None = None,
        ring_size: int = 50,
    ) -> None:
        self.spec = spec
        self.gen = gen
        self.log = LogRing(ring_size)
        self._outbox = outbox
        self._ledger = ledger
        self._stop = trio.Event()
        self._kill = False
        self._keep = True  # run spec.before_stop (the KV save) before this stop
        self.port: int | None = None
        self.pid: int | None = None
        self.failure: tuple[LogKind, str] | None = None  # the first OOM/backend error line
        self._ready = False  # the child said "ready" (its load is over)
        self._last_output = 0.0  # when the child last printed anything
        self._stalled = False  # killed by the load timeout
        self._log = about(log, spec.model)
        self._child_log = about(child_log, spec.model)  # the child's own stderr lines

    @property
    def model(self) -> str:
        return self.spec.model

    def stop(self, *, kill: bool, keep: bool = True) -> None:
        """Ask the child to go (from the scheduler: never blocks). ``keep``: what it
        holds is worth keeping (its slots are saved first, unless it is killed)."""
        self._kill = self._kill or kill
        self._keep = self._keep and keep
        self._stop.set()

    async def run(self, delay: float = 0.0) -> None:
        """Run until the child is gone; always ends with exactly one ``Exited``."""
        async with self._outbox:
            try:
                try:
                    code, detail = await self._run(delay)
                except Exception as exc:  # an actor bug is this model's failure only
                    self._log.exception("instance actor failed")
                    if self.pid is not None:
                        kill_group(self.pid)
                    code, detail = 1, f"troupe instance error: {exc!r}"
                with trio.CancelScope(shield=True):
                    oom = self.failure is not None and self.failure[0] is LogKind.OOM
                    device = oom_device(self.failure[1]) if oom and self.failure else None
                    await self._outbox.send(
                        Exited(
                            self.model,
                            self.gen,
                            code,
                            expected=self._stop.is_set(),
                            detail=detail,
                            oom=oom,
                            oom_device=self.spec.device_names.get(device or ""),
                        )
                    )
            finally:
                # After the news and off the event loop: a swap's next child waits on the
                # news, and an entry left for a dead pid is harmless (create times differ).
                if self.pid is not None and self._ledger is not None:
                    with trio.CancelScope(shield=True):
                        await trio.to_thread.run_sync(self._ledger.remove, self.pid)

    async def _run(self, delay: float) -> tuple[int, str | None]:
        if delay > 0:
            with trio.move_on_after(delay):
                await self._stop.wait()
        if self._stop.is_set():
            # Stopped before it started; a kill reads as upstream's killed load (exit 1).
            return (1, "killed before it started") if self._kill else (0, None)
        try:
            port = self.port = free_port()
            argv = list(self.spec.argv(port))
            proc = await spawn_child(argv, self.spec.env, self.spec.cwd, cpus=self.spec.cpus)
        except OSError as exc:
            self._log.error("failed to spawn server instance: %s", exc)
            return 1, f"failed to spawn server instance: {exc.strerror or exc}"
        self.pid = proc.pid
        if self._ledger is not None:
            self._ledger.add(proc.pid, self.model)
        self._log.info("spawned (pid %d) on port %d: %s", proc.pid, port, " ".join(argv))
        try:
            connections = http_threads(argv, self.spec.env)
            slots = parallel_slots(argv, self.spec.env)  # the core caps leases at these
            await self._outbox.send(
                Spawned(self.model, self.gen, port, proc.pid, connections, slots=slots)
            )
            returncode = await self._supervise(proc)
        finally:
            if proc.returncode is None:
                # Cancelled (the router is going down hard): never leave the child behind.
                with trio.CancelScope(shield=True):
                    kill_group(proc.pid)
                    await proc.wait()
        kill_group(proc.pid)  # nothing of this child's group may outlive it
        how = _describe_exit(returncode)
        code = returncode if returncode >= 0 else 1  # upstream reports a signal death as 1
        if self._stop.is_set() and code == 0:
            self._log.info("stopped (%s)", how)
            return code, None
        tail = " | ".join(self.log.tail(TAIL_LINES))
        detail = how
        if self._stalled:
            detail = (
                f"load timed out: no progress for {self.spec.load_timeout:g} s "
                f"(--load-timeout), {how}"
            )
        missing = self.spec.model_file
        if missing is not None and not self._stop.is_set() and not missing.exists():
            detail += f"; model file {missing}: no such file"
        if returncode < 0 and (advice := describe_exit_signal(-returncode)):
            detail += f" ({advice})"
        if self.failure is not None:
            detail += f"; {self.failure[0].value}: {self.failure[1]}"
        if tail:
            detail += f"; last log lines: {tail}"
        (self._log.info if self._stop.is_set() else self._log.warning)("exited: %s", detail)
        return code, detail

    async def _supervise(self, proc: trio.Process) -> int:
        assert proc.stdout is not None
        assert proc.stderr is not None
        stdout, stderr = proc.stdout, proc.stderr
        out_done, err_done = trio.Event(), trio.Event()

        async def read_out() -> None:
            await self._read_stdout(stdout)
            out_done.set()

        async def read_err() -> None:
            await self._read_stderr(stderr)
            err_done.set()

        async with trio.open_nursery() as nursery:
            self._last_output = trio.current_time()
            nursery.start_soon(read_out)
            nursery.start_soon(read_err)
            nursery.start_soon(self._stop_when_asked, proc)
            nursery.start_soon(self._watch_load, proc)
            await proc.wait()
            # A final state line may still sit in the pipe; a grandchild holding the pipe
            # open must not keep us here, hence the bound.
            with trio.move_on_after(READER_DRAIN):
                await out_done.wait()
                await err_done.wait()
            nursery.cancel_scope.cancel()
        assert proc.returncode is not None
        return proc.returncode

    async def _stop_when_asked(self, proc: trio.Process) -> None:
        await self._stop.wait()
        await self._before_stop()
        stage = await stop_child(
            proc,
            kill=self._kill,
            stop_timeout=self.spec.stop_timeout,
            term_grace=self.spec.term_grace,
        )
        self._log.info("stopped at stage %s", stage)

    async def _before_stop(self) -> None:
        hook, port = self.spec.before_stop, self.port
        if hook is None or port is None or self._kill or not self._keep or not self._ready:
            return
        with trio.move_on_after(self.spec.before_stop_seconds) as scope:
            try:
                await hook(self.gen)
            except Exception:  # the stop goes on whatever the save did
                self._log.exception("saving before the stop failed")
        if scope.cancelled_caught:
            self._log.warning(
                "saving before the stop took over %gs: abandoned", self.spec.before_stop_seconds
            )

    async def _watch_load(self, proc: trio.Process) -> None:
        """Kill the child if its load shows no progress for ``load_timeout`` seconds."""
        timeout = self.spec.load_timeout
        if timeout is None:
            return
        while not self._ready and not self._stop.is_set():
            await trio.sleep_until(self._last_output + timeout)
            stalled = trio.current_time() - self._last_output >= timeout
            if stalled and not self._ready and not self._stop.is_set():
                self._log.error("load made no progress for %gs (no output): killing it", timeout)
                self._stalled = True
                kill_group(proc.pid)
                return

    async def _read_stdout(self, stream: trio.abc.ReceiveStream) -> None:
        async for line in iter_lines(stream):
            self._last_output = trio.current_time()
            state = parse_state_line(line)
            if state is None:
                if line.strip():
                    self._child_log.warning("unexpected output on the command pipe: %s", line)
                continue
            if state.state not in KNOWN_STATES:
                self._log.warning("reported an unknown state %r: ignored", state.state)
                continue
            if state.state == "ready":
                self._ready = True
            await self._outbox.send(ChildState(self.model, self.gen, state.state, state.payload))

    async def _read_stderr(self, stream: trio.abc.ReceiveStream) -> None:
        async for line in iter_lines(stream):
            self._last_output = trio.current_time()
            self.log.append(line)
            if self.spec.log_sink is not None:
                self.spec.log_sink(line)
            if self.failure is None:
                kind = classify_line(line)
                if kind is not None:
                    self.failure = (kind, line.strip())
                    self._log.warning("reported %s: %s", kind.value, line.strip())
            self._child_log.info("%s", line)
