"""The conversation tracker stays bounded whatever ids clients choose."""

from __future__ import annotations

import trio

from troupe.conversations import ConversationTracker


def test_the_table_forgets_the_least_recently_used_conversations_past_its_limit() -> None:
    tracker = ConversationTracker(limit=3)
    for i in range(10):
        tracker.remember(f"c{i}", "m", owner="")
    assert len(tracker) == 3
    assert [tracker.lookup(f"c{i}", owner="") for i in (6, 7, 8, 9)] == [None, "m", "m", "m"]
    tracker.remember("c7", "m", owner="")  # used again: now the most recent
    tracker.remember("new", "m", owner="")
    assert tracker.lookup("c7", owner="") == "m"
    assert tracker.lookup("c8", owner="") is None


async def test_a_conversation_whose_request_waits_is_never_forgotten() -> None:
    tracker = ConversationTracker(limit=2)
    ticket = tracker.remember("waiting", "m", owner="")
    scope = trio.CancelScope()
    tracker.attach("waiting", ticket, scope, owner="")
    for i in range(5):
        tracker.remember(f"c{i}", "m", owner="")
    assert tracker.alive("waiting", ticket, owner="")
    assert not scope.cancel_called


async def test_another_owners_id_is_an_id_that_does_not_exist() -> None:
    tracker = ConversationTracker()
    ticket = tracker.remember("c", "m", owner="alice")
    scope = trio.CancelScope()
    tracker.attach("c", ticket, scope, owner="alice")
    assert tracker.lookup("c", owner="bob") is None
    tracker.forget("c", owner="bob")  # bob's stop of alice's id: nothing happens
    assert not scope.cancel_called
    bobs = tracker.remember("c", "other", owner="bob")  # bob's own, beside alice's
    assert not scope.cancel_called
    assert tracker.alive("c", ticket, owner="alice")
    assert tracker.lookup("c", owner="alice") == "m"
    assert tracker.lookup("c", owner="bob") == "other"
    assert not tracker.alive("c", bobs, owner="")
    tracker.forget("c", owner="alice")
    assert scope.cancel_called
    assert tracker.lookup("c", owner="bob") == "other"
