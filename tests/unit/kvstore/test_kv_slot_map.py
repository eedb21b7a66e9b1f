"""`SlotMap` without an engine: which slot a request gets, what is saved first, and that
a request that leaves (an error, a cancelled client) never keeps a slot busy."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from troupe.kvstore.slots import SlotMap, request_text

A = "Conversation A: " + "the harbour master kept a ledger. " * 20
B = "Conversation B: " + "the lighthouse keeper kept a diary. " * 20
C = "Conversation C: " + "the ferry captain kept a log. " * 20
SYSTEM = "You are a patient guide to the coast. " * 10


async def turn(slots: SlotMap, text: str, conv: str = "") -> tuple[int, bool, bool]:
    claim = slots.choose(conv, text)
    assert claim is not None
    slots.release(claim, answered=True)
    await trio.sleep(0.01)  # the next turn is later (least recently used order)
    return claim.slot, claim.own, claim.evict


async def test_a_conversation_keeps_its_slot_and_the_least_recently_used_one_is_taken() -> None:
    slots = SlotMap([0, 1], served=set())
    assert await turn(slots, A) == (0, False, False)  # empty slots first: nothing to save
    assert await turn(slots, B) == (1, False, False)
    assert await turn(slots, A + " and then") == (0, True, False)  # its own slot
    # A third conversation takes the least recently used slot (B's), which is saved first.
    assert await turn(slots, C) == (1, False, True)
    # B comes back: not on a slot any more, takes A's (now the least recently used).
    assert await turn(slots, B + " later") == (0, False, True)
    assert await turn(slots, C + " later") == (1, True, False)


async def test_a_shared_beginning_is_not_a_conversation_of_its_own() -> None:
    slots = SlotMap([0, 1], served=set())
    first = SYSTEM + A
    assert await turn(slots, first) == (0, False, False)
    # Same system prompt, another conversation: shares less than half of slot 0's text.
    assert await turn(slots, SYSTEM + B) == (1, False, False)
    assert await turn(slots, first + " and then") == (0, True, False)


async def test_a_conversation_id_wins_over_the_text() -> None:
    slots = SlotMap([0, 1], served=set())
    assert await turn(slots, A, conv="x") == (0, False, False)
    # Another id with the same text is another conversation.
    assert await turn(slots, A, conv="y") == (1, False, False)
    assert await turn(slots, "something else entirely", conv="x") == (0, True, False)


async def test_slots_that_served_before_the_map_are_saved_before_they_are_taken() -> None:
    slots = SlotMap([0, 1], served={0})
    assert await turn(slots, A) == (1, False, False)  # the empty one first
    assert await turn(slots, B) == (0, False, True)  # unknown content: saved first


async def test_a_request_that_is_not_answered_leaves_its_slot_idle_and_unknown() -> None:
    slots = SlotMap([0], served=set())
    claim = slots.choose("", A)
    assert claim is not None
    assert slots.choose("", B) is None  # busy
    slots.release(claim, answered=False)
    again = slots.choose("", A + " and then")
    assert again is not None
    assert (again.own, again.evict) == (False, True)  # not A's any more; saved before use


async def test_a_waiting_claim_gets_the_slot_once_it_is_released_and_a_cancelled_one_nothing() -> (
    None
):
    slots = SlotMap([0], served=set())
    first = slots.choose("", A)
    assert first is not None
    got: list[int] = []

    async def wait_for_a_slot(text: str) -> None:
        claim = await slots.claim("", text)
        assert claim is not None
        got.append(claim.slot)
        slots.release(claim, answered=True)

    leaving = trio.CancelScope()

    async def leaves() -> None:
        with leaving:
            await wait_for_a_slot(C)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(leaves)
        nursery.start_soon(wait_for_a_slot, B)
        await trio.testing.wait_all_tasks_blocked()
        leaving.cancel()  # this client leaves while it waits: it claims nothing
        await trio.testing.wait_all_tasks_blocked()
        assert got == []
        slots.release(first, answered=True)
    assert got == [0]
    assert slots.choose("", A) is not None  # nothing left busy


async def test_without_kept_idle_slots_only_empty_slots_are_claimed() -> None:
    slots = SlotMap([0, 1], served=set(), keeps=False)
    assert await turn(slots, A) == (0, False, False)
    assert await turn(slots, B) == (1, False, False)
    assert await slots.claim("", A + " and then") is None  # not steered: no waiting


@pytest.mark.parametrize(
    ("request_", "grows"),
    [
        ({"prompt": "Once upon a time"}, {"prompt": "Once upon a time there was"}),
        (
            {"messages": [{"role": "user", "content": "hi"}]},
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "content": "hello"},
                ]
            },
        ),
    ],
)
def test_the_next_turn_extends_the_text(
    request_: dict[str, object], grows: dict[str, object]
) -> None:
    assert request_text(grows).startswith(request_text(request_))


async def test_a_slot_known_to_hold_little_is_taken_without_a_save() -> None:
    slots = SlotMap([0], served=set(), min_tokens=256)
    claim = slots.choose("", A)
    assert claim is not None
    slots.release(claim, answered=True, tokens=255)  # its answer said: under the threshold
    taken = slots.choose("", B)
    assert taken is not None
    assert (taken.slot, taken.evict) == (0, False)
    slots.release(taken, answered=True, tokens=256)
    again = slots.choose("", C)
    assert again is not None
    assert again.evict  # worth keeping: saved first
    slots.release(again, answered=True)  # its size not said: saved, as before
    last = slots.choose("", A)
    assert last is not None
    assert last.evict
    # A request that was not answered leaves its slot's content (and size) unknown.
    slots.release(last, answered=False, tokens=10)
    after = slots.choose("", B)
    assert after is not None
    assert after.evict
