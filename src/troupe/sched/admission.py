"""Memory admission: what the children hold, how fresh the last reading is, and whether
a model fits now.

A reading is *fresh* while nothing that changes memory use (a spawn, a ready, an exit)
happened since it was asked for, and *conservative* while only releases happened
since (it understates what is free, so a model it admits still fits). The core asks
for a reading through `ask` (a `SampleMemory` effect), answers with `took` or
`could_not_read`, and asks `verdict` before a load.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping

import attrs

from troupe.sched.devices import Fit
from troupe.sched.effects import SampleMemory
from troupe.sched.memory import MemoryLedger, MemorySample
from troupe.sched.table import ModelConfig, ModelState

__all__ = ["TRUE_UP_DELAY", "Admit", "Evict", "MemoryAdmission", "Verdict", "Wait"]

TRUE_UP_DELAY = 0.5  # seconds after a child is ready before it is read (unless sooner)


@attrs.frozen
class Admit:
    warning: str | None = None  # loads although the check did not pass (and why)


@attrs.frozen
class Wait:
    pass


@attrs.frozen
class Evict:
    victim: str  # one eviction at a time; the load waits for it


Verdict = Admit | Wait | Evict


class MemoryAdmission:
    def __init__(self, ledger: MemoryLedger) -> None:
        self.ledger = ledger
        self.sample: MemorySample | None = None
        self._version = 0  # bumped by every change that may move memory use
        self._grown = 0  # the last change that may have taken memory (not an exit)
        self._sampled = -1  # the version the current sample was asked for at
        self._failed = -1  # a reading of this version could not be made
        self._asking = False
        # A child that came up is read again a moment later, not at once: its first
        # requests run then, and a reading competes with them for the CPU.
        self._true_up_due: float | None = None
        self._true_up_version = 0  # a reading of this version or later does it

    # ----- what changed ---------------------------------------------------------------------

    def changed(self, *, released: bool = False) -> None:
        """``released``: a child exited or went to sleep, so memory can only have come back."""
        self._version += 1
        if not released:
            self._grown = self._version

    def came_up(self, now: float) -> None:
        """A child is ready: learn what it really holds, soon."""
        self._true_up_due = now + TRUE_UP_DELAY
        self._true_up_version = self._version

    # ----- readings -------------------------------------------------------------------------

    def fresh(self) -> bool:
        return self.sample is not None and self._sampled == self._version

    def conservative(self) -> bool:
        return self.sample is not None and self._grown <= self._sampled

    def ask(self, pids: tuple[int, ...]) -> SampleMemory | None:
        """The reading to take now, unless one is under way."""
        if self._asking:
            return None
        self._asking = True
        return SampleMemory(pids, self._version)

    def took(self, sample: MemorySample, version: int, models: Iterable[ModelState]) -> None:
        """The reading asked for at ``version``: what each loaded child holds, from now on."""
        self._asking = False
        self.sample = sample
        self._sampled = version
        if version >= self._true_up_version:
            self._true_up_due = None  # this reading trues up every model up by then
        for m in models:
            used = sample.footprint.get(m.pid) if m.pid else None
            if used and m.child_loaded:
                self.ledger.true_up(m.name, used, sample.blind)

    def could_not_read(self, version: int) -> None:
        self._asking = False
        self._failed = version

    def deadline(self) -> float | None:
        return self._true_up_due

    def true_up_due(self, now: float) -> bool:
        """Is the delayed reading after a ready due? (Then it is no longer pending.)"""
        if self._true_up_due is not None and now >= self._true_up_due:
            self._true_up_due = None
            return True
        return False

    # ----- admission ------------------------------------------------------------------------

    def fits_now(
        self, name: str, holders: Mapping[str, int], config: ModelConfig | None = None
    ) -> bool | None:
        """On a reading with nothing started since: does ``name`` fit beside ``holders``?
        None when there is no such reading (ask for one)."""
        if not (self.fresh() or self.conservative()):
            return None
        assert self.sample is not None
        return self._fits(name, holders, config)

    def _fits(self, name: str, holders: Mapping[str, int], config: ModelConfig | None) -> bool:
        """Does ``name`` fit on the current reading? Where it would go is kept for its
        spawn (`MemoryLedger.planned`)."""
        assert self.sample is not None
        ledger = self.ledger
        fit = ledger.fit(
            name,
            self.sample,
            holders,
            config.gpu if config is not None else None,
            config.layers if config is not None else None,
        )
        if fit is None or fit.short:
            return False
        self._plan(name, fit)
        return True

    def _plan(self, name: str, fit: Fit | None) -> None:
        if fit is not None and fit.plan is not None:
            self.ledger.planned[name] = fit.plan
        else:
            self.ledger.planned.pop(name, None)

    def verdict(
        self,
        name: str,
        holders: Mapping[str, int],
        *,
        stopping: bool,
        victim: Callable[[Collection[str]], str | None],
        config: ModelConfig | None = None,
        pinned: Collection[str] = (),
    ) -> tuple[Verdict, bool]:
        """May ``name`` load now? And whether a new reading is needed first. ``stopping``:
        a model is on its way out already; ``victim``: the idle model to evict for it,
        one holding memory on one of the devices given; ``config``: its device flags and
        layers, for where it goes (`MemoryLedger.fit`)."""
        ledger = self.ledger
        ledger.planned.pop(name, None)
        if ledger.need(name) is None:
            return Admit(), False  # unknown need: load without the check, learn it once up
        if not self.fresh():
            if self._failed == self._version:
                return Admit("loading without the memory check: memory could not be read"), False
            if self.conservative() and self._fits(name, holders, config):
                return Admit(), False  # it fitted before a child exited: it fits now
            return Wait(), True
        assert self.sample is not None
        fit = ledger.fit(
            name,
            self.sample,
            holders,
            config.gpu if config is not None else None,
            config.layers if config is not None else None,
            kept=pinned,
        )
        if fit is None or not fit.short:
            self._plan(name, fit)
            return Admit(), False
        deficit = fit.short[0]
        if stopping:
            return Wait(), False  # one eviction at a time: wait until it is gone
        for room in fit.short:
            # A victim on the device that needs room, not anywhere.
            chosen = victim(tuple(room))
            if chosen is not None:
                return Evict(chosen), False
        if fit.meanwhile:
            # Nothing to free for fewer cards: it goes on more, where it fits now.
            self._plan(name, fit)
            return Admit(), False
        if not any(h != name for h in holders):
            # Nothing else to give up: load anyway, as upstream does, but say so.
            short = ", ".join(f"{dev}: {n >> 20} MiB" for dev, n in sorted(deficit.items()))
            return Admit(f"loading without enough memory ({short} short)"), False
        return Wait(), False  # busy or pinned models hold the memory: wait for one to go idle
