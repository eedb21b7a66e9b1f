"""The conversation tracker stays bounded whatever ids clients choose."""

from __future__ import annotations

import trio

from troupe.conversations import ConversationTracker


def test_the_table_forgets_the_least_recently_used_conversations_past_its_limit() -> None:
    tracker = ConversationTracker(limit=3)
    for i in range(10):
        tracker.remember(f"c{i}", "m")
    assert len(tracker) == 3
    assert [tracker.lookup(f"c{i}") for i in (6, 7, 8, 9)] == [None, "m", "m", "m"]
    tracker.remember("c7", "m")  # used again: now the most recent
    tracker.remember("new", "m")
    assert tracker.lookup("c7") == "m"
    assert tracker.lookup("c8") is None


async def test_a_conversation_whose_request_waits_is_never_forgotten() -> None:
    tracker = ConversationTracker(limit=2)
    ticket = tracker.remember("waiting", "m")
    scope = trio.CancelScope()
    tracker.attach("waiting", ticket, scope)
    for i in range(5):
        tracker.remember(f"c{i}", "m")
    assert tracker.alive("waiting", ticket)
    assert not scope.cancel_called
