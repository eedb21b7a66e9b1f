"""The scheduler's pure core: the model table, the admission queue, LRU choice.

No Trio and no I/O here: `SchedulerCore` takes events and returns effects
(see `troupe.sched.effects`); the scheduler actor carries the effects out. What it
tells the world is typed (`troupe.sched.events`, `troupe.sched.reasons`) and becomes
JSON only where it leaves the process.
"""

from __future__ import annotations

from troupe.sched.core import SchedulerCore
from troupe.sched.effects import (
    Effect,
    Emit,
    Failure,
    Grant,
    Prefetch,
    Reply,
    SampleMemory,
    Spawn,
    Stop,
)
from troupe.sched.phase import Phase, Restart
from troupe.sched.reasons import StopCause, StopReason
from troupe.sched.settle import FAKE_TIMING_DELAY
from troupe.sched.snapshot import ModelView, Snapshot
from troupe.sched.status import Status
from troupe.sched.table import ModelConfig, RestartKey

__all__ = [
    "FAKE_TIMING_DELAY",
    "Effect",
    "Emit",
    "Failure",
    "Grant",
    "ModelConfig",
    "ModelView",
    "Phase",
    "Prefetch",
    "Reply",
    "Restart",
    "RestartKey",
    "SampleMemory",
    "SchedulerCore",
    "Snapshot",
    "Spawn",
    "Status",
    "Stop",
    "StopCause",
    "StopReason",
]
