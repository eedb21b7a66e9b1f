"""The scheduler's pure core: the model table, the admission queue, LRU choice.

No Trio and no I/O here: `SchedulerCore` takes events and returns effects
(see `troupe.sched.effects`); the scheduler actor carries the effects out.
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
from troupe.sched.status import Status
from troupe.sched.table import ModelConfig, ModelView, Snapshot

__all__ = [
    "Effect",
    "Emit",
    "Failure",
    "Grant",
    "ModelConfig",
    "ModelView",
    "Prefetch",
    "Reply",
    "SampleMemory",
    "SchedulerCore",
    "Snapshot",
    "Spawn",
    "Status",
    "Stop",
]
