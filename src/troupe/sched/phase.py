"""A model's lifecycle: one enum of phases and the table of every legal move.

A model is always in exactly one `Phase`. The core changes it only through `move`,
which refuses a move the table does not list (`IllegalTransition`: a bug in the
core, and the stateful tests drive every path). llama.cpp's `Status` is derived
from the phase for readers (`Phase.shows`); while a model drains or stops it shows
what its child last reported, since upstream keeps showing a stopping child as it
was until it exits.
"""

from __future__ import annotations

import enum

from troupe.sched.status import Status

__all__ = ["EXITS", "TRANSITIONS", "IllegalTransition", "Phase"]


class Phase(enum.Enum):
    UNLOADED = "unloaded"  # no child: never started, or the last one exited cleanly
    FAILED = "failed"  # no child: the last one ended with a non-zero exit code
    HELD = "held"  # no child: it crashed too often lately, held back until a deadline
    RETRYING = "retrying"  # no child: died of OOM while loading, tried again after evictions
    REPLANNING = "replanning"  # no child: stopped to start again on a narrower CPU lane
    DELAYED = "delayed"  # a spawn waiting out LLAMA_SERVER_DEBUG_FAKE_TIMING (shown unloaded)
    STARTING = "starting"  # a spawn under way: no process yet (shown loading)
    LOADING = "loading"  # the child runs and loads its model
    LOADED = "loaded"  # the child serves
    SLEEPING = "sleeping"  # the child sleeps (its memory given back); a request wakes it
    DRAINING = "draining"  # serves the requests it has, takes none: stopped once idle
    ABORTING = "aborting"  # told to stop before its process started: killed once it has
    STOPPING = "stopping"  # told to stop: waiting for its exit

    @property
    def is_running(self) -> bool:
        """Holds (or is about to hold) a child: counts against ``--models-max``."""
        return self not in _NO_CHILD

    @property
    def is_stopping(self) -> bool:
        return self is Phase.STOPPING or self is Phase.ABORTING

    @property
    def is_spawning(self) -> bool:
        """A Spawn was issued and its process has not started yet."""
        return self in (Phase.DELAYED, Phase.STARTING, Phase.ABORTING)

    @property
    def serves(self) -> bool:
        """Takes new leases: up (loaded or asleep) and not on its way out."""
        return self is Phase.LOADED or self is Phase.SLEEPING

    @staticmethod
    def reporting(status: Status) -> Phase:
        """The phase of a child serving (or loading) that last reported ``status``."""
        return _REPORTING[status]

    def shows(self, reported: Status) -> Status:
        """llama.cpp's status for this phase; ``reported`` is what the current child last
        said (or what troupe announced for it), shown while it drains or stops."""
        fixed = _SHOWN.get(self)
        return reported if fixed is None else fixed


_NO_CHILD = frozenset({Phase.UNLOADED, Phase.FAILED, Phase.HELD, Phase.RETRYING, Phase.REPLANNING})
_SHOWN = {
    Phase.UNLOADED: Status.UNLOADED,
    Phase.FAILED: Status.UNLOADED,
    Phase.HELD: Status.UNLOADED,
    Phase.RETRYING: Status.UNLOADED,
    Phase.REPLANNING: Status.UNLOADED,
    Phase.DELAYED: Status.UNLOADED,
    Phase.STARTING: Status.LOADING,
    Phase.LOADING: Status.LOADING,
    Phase.LOADED: Status.LOADED,
    Phase.SLEEPING: Status.SLEEPING,
}

_REPORTING = {
    Status.LOADING: Phase.LOADING,
    Status.LOADED: Phase.LOADED,
    Status.SLEEPING: Phase.SLEEPING,
}

# Where a child's end leads: clean, failed, or (crash loop) held back.
EXITS = frozenset({Phase.UNLOADED, Phase.FAILED, Phase.HELD})
_SPAWNS = frozenset({Phase.DELAYED, Phase.STARTING})
_REPORTS = frozenset({Phase.LOADING, Phase.LOADED, Phase.SLEEPING})  # a child's state lines

TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    Phase.UNLOADED: _SPAWNS,
    Phase.FAILED: _SPAWNS | {Phase.UNLOADED},  # a reload clears "failed"
    # The hold ends (its deadline passed, or an explicit load or a reload lifts it).
    Phase.HELD: frozenset({Phase.FAILED, Phase.UNLOADED}),
    # Its evictions are done (spawned again), or the retry is called off.
    Phase.RETRYING: frozenset({Phase.STARTING, Phase.FAILED, Phase.UNLOADED}),
    # Started again on its new lane, or called off (shutdown, unload, a reload).
    Phase.REPLANNING: frozenset({Phase.STARTING, Phase.UNLOADED}),
    Phase.DELAYED: EXITS | {Phase.LOADING, Phase.ABORTING},
    Phase.STARTING: EXITS | {Phase.LOADING, Phase.ABORTING, Phase.RETRYING},
    Phase.LOADING: EXITS | _REPORTS | {Phase.STOPPING, Phase.RETRYING},
    Phase.LOADED: EXITS | _REPORTS | {Phase.DRAINING, Phase.STOPPING},
    Phase.SLEEPING: EXITS | _REPORTS | {Phase.DRAINING, Phase.STOPPING},
    # A drain is called off when the model it was for no longer waits: back to serving.
    Phase.DRAINING: EXITS | _REPORTS | {Phase.STOPPING, Phase.RETRYING},
    Phase.ABORTING: EXITS | {Phase.STOPPING, Phase.REPLANNING},  # started: stopped like any
    Phase.STOPPING: EXITS | {Phase.REPLANNING},
}


class IllegalTransition(AssertionError):
    """The core tried a move its lifecycle does not allow: a bug in the core."""

    def __init__(self, model: str, old: Phase, new: Phase) -> None:
        super().__init__(f"model {model}: no transition {old.name} -> {new.name}")
        self.model = model
        self.old = old
        self.new = new
