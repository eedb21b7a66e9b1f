"""The CPU ledger (pure): which physical cores each child troupe placed runs on.

Two children generating at once on the same cores run tens of times slower than each on
cores of its own (ggml's threads meet at a spinning barrier per op, and a descheduled
thread stalls the rest), and a child's thread count is fixed when it starts. So the
plan is made at each spawn, from the children that will be running beside it:

* a child that will run alone gets every core (as the engine's default would);
* with ``k`` children, the cores are split into ``k`` disjoint lanes (at most one per
  core; past that, lanes of one core are shared, one thread each, no polling);
* a child that is wider than its lane would now be is *re-planned*: the newcomer starts
  at once on the cores that child will give up (a lane marked shared meanwhile: one
  thread per core, no polling), and the wider child is started again on its narrower
  lane as soon as it has no request (the drain's mechanism: `troupe.sched.rules.drain`), or
  once it is ready if it was still loading. A load never waits for a lane.

A child whose command line sets ``--threads`` or a CPU set itself is left as given; the
ledger counts what it holds (its CPU set, or that many cores wherever the OS puts them).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

import attrs

__all__ = ["CpuCore", "CpuLedger", "CpuPlan", "CpuRequest", "CpuTopology", "lane_widths"]


@attrs.frozen
class CpuCore:
    """One physical core: its logical CPUs (SMT siblings; the first is used) and node."""

    cpus: tuple[int, ...]
    node: int = 0

    @property
    def cpu(self) -> int:
        return self.cpus[0]


@attrs.frozen
class CpuTopology:
    """The physical cores in the process's allowed CPU set, in CPU order."""

    cores: tuple[CpuCore, ...]

    @property
    def size(self) -> int:
        return len(self.cores)

    def cpus_of(self, cores: Iterable[int]) -> tuple[int, ...]:
        return tuple(sorted(self.cores[i].cpu for i in cores))


@attrs.frozen
class CpuPlan:
    """Where one child runs: cores (indices into the topology), its threads, and whether
    its lane is shared with another child (then it must not spin while it waits)."""

    cores: tuple[int, ...]
    cpus: tuple[int, ...]  # logical CPU ids, for --cpu-range/--cpu-mask and affinity
    threads: int
    shared: bool = False


@attrs.frozen
class CpuRequest:
    """What a child's own command line says about its CPUs: leave it as given."""

    threads: int | None = None
    cpus: tuple[int, ...] | None = None  # --cpu-range/--cpu-mask, when set

    def holds(self, topology: CpuTopology) -> int:
        """How many cores it keeps busy."""
        if self.cpus is not None:
            return len({c for c in range(topology.size) if topology.cores[c].cpu in self.cpus})
        return min(topology.size, self.threads or topology.size)


def lane_widths(cores: int, lanes: int) -> list[int]:
    """``cores`` split into ``lanes`` as evenly as can be (wider lanes first)."""
    lanes = max(1, min(lanes, cores))
    base, extra = divmod(cores, lanes)
    return [base + (1 if i < extra else 0) for i in range(lanes)]


class CpuLedger:
    def __init__(self, topology: CpuTopology) -> None:
        self.topology = topology
        self.placed: dict[str, CpuPlan] = {}  # running children troupe placed
        self.fixed: dict[str, CpuRequest] = {}  # running children placed by their flags

    def release(self, model: str) -> None:
        self.placed.pop(model, None)
        self.fixed.pop(model, None)

    def hold_fixed(self, model: str, request: CpuRequest) -> None:
        self.fixed[model] = request

    def hold(self, model: str, plan: CpuPlan) -> None:
        self.placed[model] = plan

    def _fixed_cores(self) -> tuple[set[int], int]:
        """Cores pinned by explicit CPU sets, and how many more explicit threads run
        wherever the OS puts them."""
        pinned: set[int] = set()
        loose = 0
        for request in self.fixed.values():
            if request.cpus is not None:
                pinned |= {
                    i for i, core in enumerate(self.topology.cores) if core.cpu in request.cpus
                }
            else:
                loose += request.holds(self.topology)
        return pinned, loose

    def width_for(self, children: int) -> int:
        """The lane of one of ``children`` placed children running at once."""
        pinned, loose = self._fixed_cores()
        free = max(1, self.topology.size - len(pinned) - loose)
        return lane_widths(free, children)[-1]

    def plan(
        self, model: str, beside: Iterable[str], shrinking: Collection[str] = ()
    ) -> tuple[CpuPlan | None, list[str]]:
        """A lane for ``model`` beside the children in ``beside`` (the others that will be
        running with it, placed or about to be). None and the placed children to re-plan
        (narrower) when its lane is held by children wider than they may now be.

        ``shrinking``: children about to be narrowed; they count as holding only the
        first cores of their lane, and a lane that takes the rest is marked shared until
        they are (`borrow`)."""
        near = set(beside) - {model}
        others = {m: p for m, p in self.placed.items() if m in near}
        pinned, loose = self._fixed_cores()
        usable = [i for i in range(self.topology.size) if i not in pinned]
        count = 1 + sum(1 for m in near if m not in self.fixed)  # placed, or coming back
        width = self.width_for(count)
        shared = count > max(1, len(usable) - loose)
        for m in shrinking:
            if m in others:
                others[m] = attrs.evolve(others[m], cores=others[m].cores[:width])
        held = {c for p in others.values() for c in p.cores}
        free = [i for i in usable if i not in held]
        if shared:
            # More children than cores: one core each, the least shared one.
            load: Mapping[int, int] = {
                i: sum(1 for p in others.values() if i in p.cores) for i in usable
            }
            core = min(usable or [0], key=lambda i: (load.get(i, 0), i))
            return self._make((core,), shared=True), []
        if len(free) >= width:
            return self._make(self._pick(free, width), shared=False), []
        too_wide = sorted(
            (m for m, p in others.items() if len(p.cores) > width),
            key=lambda m: (-len(others[m].cores), m),
        )
        return None, too_wide

    def borrow(self, model: str, beside: Iterable[str]) -> tuple[CpuPlan | None, list[str]]:
        """A lane for ``model`` now: its own if one is free, else the cores the children
        wider than their lanes will give up once narrowed (shared until then); those
        children are the second item."""
        beside = list(beside)
        plan, too_wide = self.plan(model, beside)
        if plan is not None or not too_wide:
            return plan, []
        plan, _ = self.plan(model, beside, shrinking=too_wide)
        if plan is not None and not plan.shared:
            plan = attrs.evolve(plan, shared=True)
        return plan, too_wide

    def overlapped(self, model: str, beside: Iterable[str]) -> str | None:
        """The first child in ``beside`` whose lane ``model``'s overlaps while ``model`` is
        wider than its lane may be now (it must be narrowed); None when it need not be."""
        mine = self.placed.get(model)
        if mine is None:
            return None
        near = sorted(set(beside) - {model})
        if len(mine.cores) <= self.width_for(1 + sum(1 for m in near if m not in self.fixed)):
            return None
        for other in near:
            theirs = self.placed.get(other)
            if theirs is not None and not set(mine.cores).isdisjoint(theirs.cores):
                return other
        return None

    def _pick(self, free: list[int], width: int) -> tuple[int, ...]:
        """``width`` free cores, from one NUMA node where one has enough."""
        by_node: dict[int, list[int]] = {}
        for i in free:
            by_node.setdefault(self.topology.cores[i].node, []).append(i)
        for cores in sorted(by_node.values(), key=len, reverse=True):
            if len(cores) >= width:
                return tuple(cores[:width])
        return tuple(free[:width])

    def _make(self, cores: tuple[int, ...], *, shared: bool) -> CpuPlan:
        return CpuPlan(cores, self.topology.cpus_of(cores), len(cores), shared)
