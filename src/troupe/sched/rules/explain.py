"""What the queue's requests wait for, once every rule of this settle has run.

`Waiters` recorded each entry's reason when it judged it; a rule after it may have
started that model (a parked load, a narrowed child's restart), or stopped or drained
another one that frees the room the gate found missing. Such an entry's reason is said
again here: "loading" for a model now starting, and the gate's own wait (`LoadGate.wait`)
for one the gate made wait. Nothing is decided here.
"""

from __future__ import annotations

from troupe.sched.phase import Phase
from troupe.sched.rules.parts import Rule
from troupe.sched.verdicts import LOADING

__all__ = ["Explain"]

_STARTING = frozenset({Phase.STARTING, Phase.LOADING})  # a delayed spawn too


class Explain(Rule):
    def due(self) -> bool:
        return bool(self.p.queue.entries)

    def run(self, now: float) -> None:
        p = self.p
        for e in p.queue.entries:
            m = p.table.get(e.model)
            if e.loading or m is None:
                continue  # its claim (or what holds it) said why when it was made
            if m.phase in _STARTING:
                e.reason, e.gated = LOADING, None
            elif e.gated is not None:
                e.reason = p.gate.wait(m, e.gated).reason
