"""The measurement job: what a model will take, per device, in the engine's own words.

llama-server's ``--fit`` (on by default) projects the model's memory before loading a
single weight: it loads the model with no allocation, builds a context, and logs a
per-device breakdown (model / context / compute) at verbosity 4. The job starts the
engine with exactly the child's arguments (so slots, batch, context, offload and
flash attention are the ones the child will run with) plus ``-lv 4``, reads that
breakdown from its log and kills it before it loads weights: upstream's measure role.
`llama-fit-params` projects the same way but with its own defaults (slots, batch,
outputs), which made it 2.5x the child's own figure for Gemma 3 270M.

One actor per job, one_for_one: whatever happens (the engine cannot project, it
hangs, it crashes, a bug here) ends in exactly one `Measured` or `MeasureFailed`.
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
from collections.abc import Mapping, Sequence
from contextlib import aclosing

import attrs
import trio

from troupe.child.breakdown import BreakdownRow, need_of_rows, parse_breakdown_line
from troupe.child.process import kill_group, pin
from troupe.child.protocol import iter_lines
from troupe.messages import Measured, MeasureFailed, Message
from troupe.modellog import about

__all__ = ["MEASURE_TIMEOUT", "MeasureJob", "Projection", "read_projection"]

log = logging.getLogger("troupe.measure")

MEASURE_TIMEOUT = 60.0  # seconds; a projection takes ~0.3 s for a small model on a CPU
_HEADER = "memory breakdown [MiB]"
_FIT_DONE = ("common_fit_params:", "projected to use")  # the projection is over
_TOO_LATE = ("load_tensors:", "listening on")  # it loads weights: no projection is coming
_FIT_OFF = frozenset({"off", "0", "false", "disabled"})


@attrs.frozen
class Projection:
    """The engine's projection: ``min`` at the context the child will use (the smallest
    fit may choose), ``max`` at the initial parameters when fit had to shrink them."""

    min: Mapping[str, int]
    max: Mapping[str, int] | None = None


def fit_disabled(argv: Sequence[str]) -> bool:
    for i, word in enumerate(argv[:-1]):
        if word in ("-fit", "--fit") and argv[i + 1].lower() in _FIT_OFF:
            return True
    return False


async def read_projection(stream: trio.abc.ReceiveStream) -> Projection | None:
    """The breakdown blocks of an engine's log, up to the end of its fit; None when the
    log ends or the engine starts loading without one."""
    blocks: list[list[BreakdownRow]] = []
    in_block = False
    async with aclosing(iter_lines(stream)) as lines:
        async for line in lines:
            if _HEADER in line:
                blocks.append([])
                in_block = True
                continue
            row = parse_breakdown_line(line) if in_block else None
            if row is not None:
                blocks[-1].append(row)
                continue
            in_block = False
            if any(marker in line for marker in _FIT_DONE) and blocks:
                break
            if any(marker in line for marker in _TOO_LATE):
                break
    blocks = [b for b in blocks if b]
    if not blocks:
        return None
    low = need_of_rows(blocks[-1])
    high = need_of_rows(blocks[0]) if len(blocks) > 1 else None
    return Projection(low, high)


class MeasureJob:
    """One projection of one model, for the configuration ``fingerprint`` names."""

    def __init__(
        self,
        model: str,
        fingerprint: str,
        argv: Sequence[str],
        env: Mapping[str, str],
        outbox: trio.MemorySendChannel[Message],
        timeout: float = MEASURE_TIMEOUT,
    ) -> None:
        self.model = model
        self.fingerprint = fingerprint
        self._argv = [*argv, "-lv", "4"]  # the breakdown is logged at verbosity 4
        self._env = {k: v for k, v in env.items() if k != "LLAMA_SERVER_ROUTER_PORT"}
        self._outbox = outbox
        self._timeout = timeout
        self.cancel_scope = trio.CancelScope()

    def cancel(self) -> None:
        """The model was removed or its preset changed: the figure would be stale."""
        self.cancel_scope.cancel()

    async def run(self) -> None:
        async with self._outbox:
            result: Message = MeasureFailed(self.model, self.fingerprint, "cancelled")
            try:
                with self.cancel_scope:
                    result = await self._measure()
            except Exception as exc:  # a bug here fails this measurement, not the router
                about(log, self.model).exception("measuring failed")
                result = MeasureFailed(self.model, self.fingerprint, f"troupe error: {exc!r}")
            with trio.CancelScope(shield=True):
                await self._outbox.send(result)

    async def _measure(self) -> Message:
        if fit_disabled(self._argv):
            return MeasureFailed(self.model, self.fingerprint, "--fit is off: no projection")
        try:
            proc = await self._start()
        except OSError as exc:
            return MeasureFailed(self.model, self.fingerprint, f"cannot start: {exc}")
        assert proc.stderr is not None
        stderr = trio.lowlevel.FdStream(os.dup(proc.stderr.fileno()))
        proc.stderr.close()
        try:
            with trio.move_on_after(self._timeout) as deadline:
                projection = await read_projection(stderr)
            if deadline.cancelled_caught:
                return MeasureFailed(
                    self.model, self.fingerprint, f"no projection within {self._timeout:g} s"
                )
        finally:
            with trio.CancelScope(shield=True):
                kill_group(proc.pid)  # before it loads a single weight
                await trio.to_thread.run_sync(proc.wait)
                await stderr.aclose()
        if projection is None:
            return MeasureFailed(self.model, self.fingerprint, "the engine printed no projection")
        about(log, self.model).info("the engine projects %s", _mib(projection.min))
        return Measured(self.model, self.fingerprint, projection.min, projection.max)

    async def _start(self) -> subprocess.Popen[bytes]:
        """The engine, started from a worker thread this job may leave: a cancelled job
        (the core gave up on it, a shutdown) never waits for a spawn that does not return
        (one did not, once, under heavy load). A process that starts after the job left
        is killed there and then; one handed over as the job is cancelled, here."""
        lock = threading.Lock()
        handed: list[subprocess.Popen[bytes]] = []
        left = False

        def spawn() -> None:
            proc = subprocess.Popen(
                self._argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env=dict(self._env),
                start_new_session=True,
            )
            # Background work never competes with serving: idle priority, one core.
            pin(proc.pid, [max(os.sched_getaffinity(0))], idle=True)
            with lock:
                if not left:
                    handed.append(proc)
                    return
            _reap(proc)

        try:
            await trio.to_thread.run_sync(spawn, abandon_on_cancel=True)
        except BaseException:
            with lock:
                left = True
                late = list(handed)
            for proc in late:
                _reap(proc)
            raise
        return handed[0]


def _reap(proc: subprocess.Popen[bytes]) -> None:
    """Kill a measurement's engine nobody reads (in a thread: it waits for the exit)."""
    kill_group(proc.pid)
    proc.wait()
    if proc.stderr is not None:
        proc.stderr.close()


def _mib(need: Mapping[str, int]) -> str:
    return ", ".join(f"{dev} {n >> 20} MiB" for dev, n in sorted(need.items()))
