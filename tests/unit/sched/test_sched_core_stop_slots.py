"""Which stops save a child's KV slots first: the core decides from the stop's reason
(`Stop.save_slots`); the instance actor only carries it out."""

from __future__ import annotations

import pytest
from schedcore_kit import Bench, stops

from troupe.sched import ModelConfig, Stop
from troupe.sched.reasons import StopCause, StopReason

# Every reason, spelled out: a new reason must say whether its stops keep the slots.
SAVES = {
    StopReason.LRU: True,
    StopReason.MEMORY: True,
    StopReason.DRAIN: True,
    StopReason.TTL: True,
    StopReason.KEEP_ALIVE: True,
    StopReason.REPLAN: True,
    StopReason.UNLOAD: True,
    StopReason.SHUTDOWN: True,
    StopReason.RELOAD: False,  # its preset changed: the slots were built under the old one
    StopReason.DROPPED: False,  # gone from the catalog
    StopReason.REMOVE: False,  # its files are deleted
}


@pytest.mark.parametrize("reason", list(StopReason))
def test_every_stop_reason_says_whether_slots_are_saved(reason: StopReason) -> None:
    assert reason.saves_slots is SAVES[reason]


def test_an_idle_model_unloaded_or_timed_out_saves_its_slots() -> None:
    b = Bench([ModelConfig("a", ttl=5.0), ModelConfig("b")])
    b.bring_up("a")
    b.bring_up("b")
    out = b.unload(b.rid(), "b")
    assert stops(out) == [
        Stop("b", 1, kill=False, cause=StopCause(StopReason.UNLOAD), save_slots=True)
    ]
    out = b.on_time(b.now + 10)
    assert stops(out) == [
        Stop("a", 1, kill=False, cause=StopCause(StopReason.TTL), save_slots=True)
    ]


def test_a_model_killed_while_loading_saves_nothing() -> None:
    b = Bench()
    b.load(b.rid(), "a")
    b.spawned("a")
    out = b.unload(b.rid(), "a")
    assert stops(out) == [
        Stop("a", 1, kill=True, cause=StopCause(StopReason.UNLOAD), save_slots=False)
    ]


def test_a_removed_model_saves_nothing() -> None:
    b = Bench()
    b.bring_up("a")
    out = b.core.remove(b.rid(), "a", b.tick())
    assert stops(out) == [
        Stop("a", 1, kill=False, cause=StopCause(StopReason.REMOVE), save_slots=False)
    ]
