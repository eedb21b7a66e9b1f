"""`SlotMap` without an engine: requests wait for a slot in arrival order (a freed slot
goes to the oldest waiting request, never to a later arrival), and a slot a client chose
itself (its own ``id_slot``) is busy while that request runs, so no request is sent to
wait for it in the engine's queue while later ones take the other slots."""

from __future__ import annotations

import trio
import trio.testing

from troupe.kvstore.slots import Claim, SlotMap

A = "Conversation A: " + "the harbour master kept a ledger. " * 20
B = "Conversation B: " + "the lighthouse keeper kept a diary. " * 20


def taken(slots: SlotMap, text: str) -> Claim:
    claim = slots.choose("", text)
    assert claim is not None
    return claim


async def test_waiting_requests_get_the_freed_slots_in_arrival_order() -> None:
    slots = SlotMap([0, 1], served=set())
    running = [taken(slots, A), taken(slots, B)]
    served: list[int] = []

    async def request(n: int) -> None:
        claim = await slots.claim("", f"Request {n}: " + "a story. " * 40)
        assert claim is not None
        served.append(n)
        running.append(claim)

    async with trio.open_nursery() as nursery:
        for n in range(8):
            nursery.start_soon(request, n)
            await trio.testing.wait_all_tasks_blocked()  # each waits before the next comes
        while running:
            slots.release(running.pop(0), answered=True)  # the oldest answer ends
            await trio.testing.wait_all_tasks_blocked()
    assert served == list(range(8))


async def test_a_freed_slot_goes_to_the_waiting_request_never_to_a_later_one() -> None:
    slots = SlotMap([0], served=set())
    first = taken(slots, A)
    got: list[Claim] = []

    async def waits() -> None:
        claim = await slots.claim("", B)
        assert claim is not None
        got.append(claim)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waits)
        await trio.testing.wait_all_tasks_blocked()
        slots.release(first, answered=True)
        # A request arriving now, before the waiting one has run: the slot is not free.
        assert slots.choose("", A + " and then") is None
    assert [c.slot for c in got] == [0]


async def test_a_request_handed_a_slot_as_it_leaves_gives_it_back() -> None:
    slots = SlotMap([0], served=set())
    first = taken(slots, A)
    leaving = trio.CancelScope()

    async def leaves() -> None:
        with leaving:
            await slots.claim("", B)
        assert leaving.cancelled_caught

    async with trio.open_nursery() as nursery:
        nursery.start_soon(leaves)
        await trio.testing.wait_all_tasks_blocked()
        leaving.cancel()  # the client leaves...
        slots.release(first, answered=True)  # ...as the slot is handed to it
    again = slots.choose("", A + " and then")
    assert again is not None  # given back, not kept busy
    assert (again.own, again.evict) == (False, True)  # its content unknown: saved first


async def test_a_slot_a_client_chose_is_busy_while_its_request_runs() -> None:
    slots = SlotMap([0, 1], served=set())
    with slots.outside(0):  # a request with its own "id_slot": 0, still generating
        other = slots.choose("", A)
        assert other is not None
        assert other.slot == 1  # never sent to wait behind it in the engine
        assert slots.choose("", B) is None
        got: list[int] = []

        async def waits() -> None:
            claim = await slots.claim("", B)
            assert claim is not None
            got.append(claim.slot)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(waits)
            await trio.testing.wait_all_tasks_blocked()
            slots.release(other, answered=True)
    assert got == [1]
    after = slots.choose("", A)
    assert after is not None
    # What the client's request left on slot 0 is unknown: saved before it is reused.
    assert (after.slot, after.own, after.evict) == (0, False, True)


async def test_a_waiting_request_takes_a_slot_a_client_chose_once_that_request_ends() -> None:
    slots = SlotMap([0], served=set())
    got: list[int] = []

    async def waits() -> None:
        claim = await slots.claim("", A)
        assert claim is not None
        got.append(claim.slot)

    async with trio.open_nursery() as nursery:
        with slots.outside(0):
            nursery.start_soon(waits)
            await trio.testing.wait_all_tasks_blocked()
            assert got == []
    assert got == [0]
