"""What a rule decides for one waiter, typed, with the reason it waits.

A waiter's verdict (`troupe.sched.rules.waiters.judge`) is one of `Serve` (its model
serves: a lease now), `Refuse` (answered with an error), `Load` (its entry claims a
slot and the model is spawned) or `Wait` (with the reason, recorded on its queue
entry for ``/models`` and the ``troupe_queue`` events). `LoadGate.verdict`
(`troupe.sched.gate`) answers `Load` or `Wait` the same way.
"""

from __future__ import annotations

import attrs

from troupe.sched.effects import Failure

__all__ = [
    "LOADING",
    "NO_LANE",
    "NO_SLOT",
    "RELOADING",
    "STOPPING",
    "WAITING_FOR_SLOT",
    "GateVerdict",
    "Load",
    "Refuse",
    "Serve",
    "Wait",
    "WaiterVerdict",
]

# Reasons more than one rule gives (the words /models and troupe_queue events show).
LOADING = "loading"
STOPPING = "waiting for a model to stop"
NO_SLOT = "waiting for a slot: every loaded model is busy or pinned"
WAITING_FOR_SLOT = "waiting for one of its instance's slots (fair queuing across tenants)"
NO_LANE = "waiting for a CPU lane"
RELOADING = "waiting for a reload to finish"


@attrs.frozen
class Serve:
    """The model serves: the waiter gets a lease now."""


@attrs.frozen
class Refuse:
    failure: Failure


@attrs.frozen
class Load:
    """The waiter's entry claims a slot and its model is spawned."""


@attrs.frozen
class Wait:
    reason: str  # in words, for /models and troupe_queue events
    # From the gate: what it waits for when nothing frees room first (`LoadGate.wait`).
    gated: str | None = None


GateVerdict = Load | Wait
WaiterVerdict = Serve | Refuse | Load | Wait
