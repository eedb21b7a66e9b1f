"""The settle step as ordered, named rules: after every event, who is answered, who
loads, who goes, and why a request waits.

The waiting rules follow llama.cpp's ``ensure_model_ready`` and its admission queue,
applied the moment something changes instead of every 200 ms. Each rule is one module
and one class (`troupe.sched.rules.parts.Rule`): `due` says cheaply whether it could
change anything now, `run` does it. `RULES` is the order the `Settler`
(`troupe.sched.settle`) runs them in, once per event. The rule for one waiter
(`troupe.sched.rules.waiters.judge`) and the load gate (`troupe.sched.gate`) return
typed verdicts (`troupe.sched.verdicts`); a wait's reason is recorded on the queue
entry, and ``/models`` and the ``troupe_queue`` events show that recorded reason.
"""

from __future__ import annotations

from troupe.sched.rules.direct import AfterCallOff, DirectLoads
from troupe.sched.rules.drain import StopDrained, call_off_drains, drained_for, start_drain
from troupe.sched.rules.evict import Evictions
from troupe.sched.rules.explain import Explain
from troupe.sched.rules.measure import MeasureNext
from troupe.sched.rules.narrow import Narrow
from troupe.sched.rules.oom_retry import OomRetry
from troupe.sched.rules.parts import Parts, Rule
from troupe.sched.rules.reload import FinishReload
from troupe.sched.rules.removals import Removals
from troupe.sched.rules.replan import Replans
from troupe.sched.rules.reserve import ReserveLanes
from troupe.sched.rules.shutdown_done import ShutdownDone
from troupe.sched.rules.slots import SlotGrants
from troupe.sched.rules.until_gone import UntilGone
from troupe.sched.rules.waiters import Waiters, judge

__all__ = [
    "RULES",
    "Parts",
    "Rule",
    "call_off_drains",
    "drained_for",
    "judge",
    "start_drain",
]

RULES: tuple[type[Rule], ...] = (
    # First: a lane reserved for a model that no longer waits is not counted by any
    # rule below that plans a lane.
    ReserveLanes,
    # A reload whose stops are done swaps the table before anyone is admitted: waiters
    # are judged against the new model list (they waited for it).
    FinishReload,
    # A removed model whose child is gone leaves the table (and frees its name) before
    # the queue is looked at.
    Removals,
    # An out-of-memory retry was claimed before anything now waiting: it spawns first,
    # once its evictions are done.
    OomRetry,
    # The queue, in arrival order, until nothing changes (drains called off first).
    Waiters,
    # Then the free slots of loaded models, to those waiting for one (fair queuing),
    # once the waiters above have seen their models serve.
    SlotGrants,
    # POST /models/load after the queue, as upstream: the waiters asked first.
    DirectLoads,
    # A narrowed child restarts after the waiters and loads (the model it made room
    # for plans first), or is unloaded when no slot is left for it...
    Replans,
    # ...and then a parked load that waited for that restart picks its victim now.
    AfterCallOff,
    # The lanes given away above are honoured: overlapping children are narrowed.
    Narrow,
    # A drained model that is idle now goes, before the evictions are counted (its own
    # waiters then need a slot of their own).
    StopDrained,
    # With every claim made, evict for the rest of the queue; the drain clock learns
    # whether the queue starves.
    Evictions,
    # After every start, stop and drain above: the reasons the queue's entries show.
    Explain,
    # Projections go to the models the loads and the queue wait for, as now decided.
    MeasureNext,
    # Last, after every stop above: those waiting for a child's end, then a shutdown.
    UntilGone,
    ShutdownDone,
)
