"""A model's lifecycle: one enum of phases and the table of every legal move.

A model is always in exactly one `Phase`. The core changes it only through
`ModelState.move`, which refuses a move the table does not list (`IllegalTransition`:
a bug in the core, and the stateful tests drive every path). What is data rather than a
state lives beside the phase on `ModelState` (`sched/table.py`): how the last child
ended (``exit_code``: a failure), a spawn's fake-timing deadline (``delay_until``), a
restart pending for a model without a child (``restart``: `Restart`), and a stop asked
for before the process started (``spawn_pending`` while STOPPING). The core decides on
the phase and that data; llama.cpp's `Status`, and the lifecycle word ``/models`` shows,
are derived from them for readers only (`troupe.sched.views`).
"""

from __future__ import annotations

import enum

__all__ = ["EXITS", "RESTARTS", "TRANSITIONS", "IllegalTransition", "Phase", "Restart"]


class Phase(enum.Enum):
    UNLOADED = "unloaded"  # no child: never started, or the last one exited (failed or not)
    HELD = "held"  # no child: it crashed too often lately, held back until a deadline
    STARTING = "starting"  # a spawn under way, no process yet (perhaps waiting out fake timing)
    LOADING = "loading"  # the child runs and loads its model
    LOADED = "loaded"  # the child serves
    SLEEPING = "sleeping"  # the child sleeps (its memory given back); a request wakes it
    DRAINING = "draining"  # serves the requests it has, takes none: stopped once idle
    STOPPING = "stopping"  # told to stop: waiting for its exit (killed once started)

    @property
    def is_running(self) -> bool:
        """Holds (or is about to hold) a child: counts against ``--models-max``."""
        return self is not Phase.UNLOADED and self is not Phase.HELD

    @property
    def is_stopping(self) -> bool:
        return self is Phase.STOPPING

    @property
    def serves(self) -> bool:
        """Takes new leases: up (loaded or asleep) and not on its way out."""
        return self is Phase.LOADED or self is Phase.SLEEPING


class Restart(enum.Enum):
    """Why a model without a child (UNLOADED) is to be started again at once."""

    OOM = "oom"  # died of OOM while loading: tried once more after its evictions
    REPLAN = "replan"  # stopped to start again on a narrower CPU lane


# Where a child's end leads: at rest (failed or not, perhaps to start again), or held back.
EXITS = frozenset({Phase.UNLOADED, Phase.HELD})
_REPORTS = frozenset({Phase.LOADING, Phase.LOADED, Phase.SLEEPING})  # a child's state lines

TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    # A spawn (a pending restart's too).
    Phase.UNLOADED: frozenset({Phase.STARTING}),
    # The hold ends (its deadline passed, or an explicit load or a reload lifts it).
    Phase.HELD: frozenset({Phase.UNLOADED}),
    Phase.STARTING: EXITS | {Phase.LOADING, Phase.STOPPING},
    Phase.LOADING: EXITS | _REPORTS | {Phase.STOPPING},
    Phase.LOADED: EXITS | _REPORTS | {Phase.DRAINING, Phase.STOPPING},
    Phase.SLEEPING: EXITS | _REPORTS | {Phase.DRAINING, Phase.STOPPING},
    # A drain is called off when the model it was for no longer waits: back to serving.
    Phase.DRAINING: EXITS | _REPORTS | {Phase.STOPPING},
    Phase.STOPPING: EXITS,
}

# The phases a child's end sets each pending restart from (the move is to UNLOADED): an
# OOM death while it loads (a spawn that never ran included), a stop for a narrower lane.
RESTARTS: dict[Restart, frozenset[Phase]] = {
    Restart.OOM: frozenset({Phase.STARTING, Phase.LOADING, Phase.DRAINING}),
    Restart.REPLAN: frozenset({Phase.STOPPING}),
}


class IllegalTransition(AssertionError):
    """The core tried a move its lifecycle does not allow: a bug in the core."""

    def __init__(self, model: str, old: Phase, new: Phase, restart: Restart | None = None) -> None:
        again = f" ({restart.name})" if restart is not None else ""
        super().__init__(f"model {model}: no transition {old.name} -> {new.name}{again}")
        self.model = model
        self.old = old
        self.new = new
