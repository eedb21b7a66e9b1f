"""Starting and stopping children, and what a child's end does to its model.

The only place that issues `Spawn` and `Stop`, so every start and stop goes through
the same bookkeeping (generations, the stop's cause and its event, swaps counted
for fair admission, a memory reading while a victim exits).
"""

from __future__ import annotations

from troupe.sched.admission import MemoryAdmission
from troupe.sched.cpu import CpuLedger, CpuPlan
from troupe.sched.devices import GpuPlan
from troupe.sched.drain import DrainClock
from troupe.sched.effects import Spawn, Stop
from troupe.sched.events import ModelStatusSet, StopRequested
from troupe.sched.outbox import Outbox
from troupe.sched.phase import Phase, Restart
from troupe.sched.reasons import StopCause
from troupe.sched.status import Status
from troupe.sched.table import ModelState, ModelTable

__all__ = ["Children", "CrashRecord"]


class CrashRecord:
    """Restart intensity (OTP's): more than ``limit`` crashes within ``window`` seconds
    holds a model back until the oldest of them leaves the window."""

    def __init__(self, limit: int, window: float) -> None:
        self.limit = limit
        self.window = window

    def crashed(self, m: ModelState, now: float) -> bool:
        """Count a crash of ``m``'s child (just gone); True when it is to be held back
        now (until ``m.held_until``)."""
        m.crashes.append(now)
        while m.crashes and m.crashes[0] <= now - self.window:
            m.crashes.popleft()
        if self.limit > 0 and len(m.crashes) >= self.limit:
            m.held_until = m.crashes[-self.limit] + self.window
            return True
        return False

    def held_back(self, m: ModelState, now: float) -> bool:
        """Is ``m`` held back now? A hold whose time is up is lifted here."""
        if m.phase is not Phase.HELD:
            return False
        assert m.held_until is not None
        if now >= m.held_until:
            lift_hold(m)
            return False
        return True

    def message(self, m: ModelState, now: float) -> str:
        assert m.held_until is not None
        left = max(1, round(m.held_until - now))
        return (
            f"model name={m.name} crashed {len(m.crashes)} times in "
            f"{self.window:g} s and is held back for {left} s more "
            "(POST /models/load retries it now)"
            + (f"; last error: {m.last_error}" if m.last_error else "")
        )


def lift_hold(m: ModelState) -> None:
    m.held_until = None
    if m.phase is Phase.HELD:
        m.move(Phase.UNLOADED)  # failed still, if its last child ended badly


class Children:
    def __init__(
        self,
        table: ModelTable,
        outbox: Outbox,
        clock: DrainClock,
        memory: MemoryAdmission | None,
        cpu: CpuLedger | None = None,
    ) -> None:
        self._table = table
        self._out = outbox
        self._clock = clock
        self._memory = memory
        self._cpu = cpu

    def spawn(self, m: ModelState, now: float, delay: float, cpu: CpuPlan | None = None) -> None:
        """Start ``m``'s next child (on lane ``cpu``, when troupe places it); ``delay``:
        its process starts that much later (fake timing)."""
        m.gpu = self._gpus_for(m)
        m.gen = self._table.next_gen(m)
        m.cpu = cpu
        m.replanned = m.restart is Restart.REPLAN
        if self._cpu is not None:
            if cpu is not None:
                self._cpu.hold(m.name, cpu)
            elif m.config.cpu is not None:
                self._cpu.hold_fixed(m.name, m.config.cpu)
        m.exit_code = 0
        m.last_stop = None
        m.drain_for = None
        m.port = m.pid = 0
        m.spawn_pending = True
        m.delay_until = now + delay if delay > 0 else None
        m.move(Phase.STARTING)  # a pending restart is under way
        if delay <= 0:
            # Upstream's load() sets "loading" as it spawns: a GET /models or an unload
            # right after a successful POST /models/load must see a running model.
            self.announce_loading(m, now)
        self._out.add(Spawn(m.name, m.gen, delay, cpu, m.gpu))

    def _gpus_for(self, m: ModelState) -> GpuPlan | None:
        """The GPUs admission found for ``m`` (`MemoryLedger.planned`); a child started
        again (a second try after an OOM, a narrower CPU lane) keeps its last ones."""
        if self._memory is None:
            return None
        ledger = self._memory.ledger
        plan = ledger.planned.pop(m.name, None)
        if plan is None and m.restart is not None:
            plan = m.gpu
        ledger.spawned(m.name, plan)
        return plan

    def announce_loading(self, m: ModelState, now: float) -> None:
        m.reported = Phase.LOADING
        m.loaded_info = None
        m.progress = None
        if not m.replanned:
            # A load is a use (upstream's load() sets last_used); a child started again on
            # a narrower CPU lane is not: the model keeps its place in the LRU order (and
            # its demand, which only requests raise).
            m.last_used = now
        m.load_started = now
        self._out.emit(ModelStatusSet(m.name, Status.LOADING))

    def started(self, m: ModelState, port: int, pid: int, now: float) -> None:
        """The spawn's process is up (``spawned``)."""
        m.port, m.pid = port, pid
        m.spawn_pending = False
        m.delay_until = None
        if m.reported is None:  # a delayed spawn: loading starts only now
            self.announce_loading(m, now)
        if m.phase is not Phase.STOPPING:  # told to stop before it started: it stops now
            m.move(Phase.LOADING)
        if self._memory is not None:
            self._memory.changed()

    def stop(self, m: ModelState, cause: StopCause, now: float) -> None:
        """Tell ``m``'s child to stop; idempotent: a model already stopping is left alone."""
        if m.stopping or not m.is_running:
            return
        m.last_stop = cause
        if cause.reason.is_swap:
            self._clock.swapped(now)
            if self._memory is not None and not self._memory.fresh():
                # Read while the victim exits: the model it makes room for is admitted on
                # this reading the moment the victim is gone (see MemoryAdmission).
                self.ask_memory()
        self._out.emit(StopRequested(m.name, cause))
        self.free_cpus(m)  # an exiting child computes nothing: its lane is free
        # A model still loading has no request to finish: it is killed at once.
        kill = m.child_loading or m.spawn_pending
        m.move(Phase.STOPPING)  # before its process started: killed once it has
        save = cause.reason.saves_slots and not kill
        self._out.add(Stop(m.name, m.gen, kill=kill, cause=cause, save_slots=save))

    def free_cpus(self, m: ModelState) -> None:
        if self._cpu is not None:
            self._cpu.release(m.name)

    def ask_memory(self) -> None:
        if self._memory is not None:
            effect = self._memory.ask(self._table.pids())
            if effect is not None:
                self._out.add(effect)
