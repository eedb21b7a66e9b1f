"""What each tenant may see of a child's ``GET /slots`` (`SlotMap.shows`,
`KvService.slots_seen_by`), without an engine: a slot's task only to the tenant whose
requests alone it can be about, and nothing once a request the engine placed itself may
have run on it."""

from __future__ import annotations

from typing import Any

from troupe.kvstore import KvService
from troupe.kvstore.slots import SlotMap
from troupe.proxy.upstream import UpstreamPool

TEXT = "x" * 1000


async def test_a_slot_s_task_is_shown_only_to_the_tenant_whose_requests_it_held() -> None:
    slots = SlotMap([0, 1], {1}, private=True)
    assert not slots.shows(1, "alice")  # served before the map: whose, unknown
    alice = await slots.claim("", TEXT, "alice")
    assert alice is not None
    # Claimed: the engine still describes the task before hers (none ran: nothing to see).
    assert not slots.shows(alice.slot, "alice")
    slots.release(alice, answered=True, tokens=400)
    assert slots.shows(alice.slot, "alice")
    assert not slots.shows(alice.slot, "bob")
    assert not slots.shows(alice.slot, "")
    # Alice's next turn on her slot: hers while it runs too.
    again = await slots.claim("", TEXT + "more", "alice")
    assert again is not None
    assert again.slot == alice.slot
    assert slots.shows(alice.slot, "alice")
    slots.release(again, answered=True)
    # Carol takes the other slot, Bob Alice's: until his request has run, the engine
    # still describes Alice's task there; then only his.
    other = await slots.claim("", "y" * 1000, "carol")
    assert other is not None
    assert other.slot != alice.slot
    bob = await slots.claim("", "z" * 1000, "bob")
    assert bob is not None
    assert bob.slot == alice.slot
    assert not slots.shows(bob.slot, "alice")
    assert not slots.shows(bob.slot, "bob")
    slots.release(bob, answered=True)
    assert slots.shows(bob.slot, "bob")
    assert not slots.shows(bob.slot, "alice")
    # A request cut short: what the slot shows is unknown.
    cut = await slots.claim("", "z" * 1000 + "more", "bob")
    assert cut is not None
    slots.release(cut, answered=False)
    assert not slots.shows(cut.slot, "bob")


async def test_a_request_the_engine_places_itself_leaves_every_slot_unknown() -> None:
    slots = SlotMap([0, 1], set(), private=True)
    alice = await slots.claim("", TEXT, "alice")
    assert alice is not None
    slots.release(alice, answered=True, tokens=400)
    bob = await slots.claim("", "y" * 1000, "bob")
    assert bob is not None
    with slots.loose():  # (Carol's embeddings: any idle slot may take them)
        assert not slots.shows(alice.slot, "alice")
        slots.release(bob, answered=True, tokens=400)
    assert not slots.shows(bob.slot, "bob")
    # Neither is anyone's conversation now: whoever takes one must not reuse it.
    again = await slots.claim("", TEXT + "more", "alice")
    assert again is not None
    assert (again.own, again.foreign) == (False, True)


async def test_a_slot_busy_when_a_loose_request_ends_is_unknown_once_released() -> None:
    slots = SlotMap([0, 1], set(), private=True)
    with slots.loose():
        alice = await slots.claim("", TEXT, "alice")
        assert alice is not None
    slots.release(alice, answered=True)
    assert not slots.shows(alice.slot, "alice")


async def test_with_one_tenant_a_loose_request_changes_nothing() -> None:
    slots = SlotMap([0], set())
    first = await slots.claim("", TEXT)
    assert first is not None
    slots.release(first, answered=True, tokens=400)
    with slots.loose():
        pass
    again = await slots.claim("", TEXT + "more")
    assert again is not None
    assert again.own


def engine_slots() -> list[dict[str, Any]]:
    task = {
        "id_task": 7,
        "n_prompt_tokens": 412,
        "n_prompt_tokens_processed": 412,
        "n_prompt_tokens_cache": 0,
        "params": {"n_predict": 4},
        "next_token": [{"has_next_token": False, "n_decoded": 4}],
        "prompt": "The vault access code is 4729.",
    }
    head = {"n_ctx": 2048, "speculative": False, "is_processing": True}
    return [{"id": 0, **head, **task}, {"id": 1, **head, **task}, "nonsense"]  # type: ignore[list-item]


async def test_the_service_shows_other_tenants_slots_as_the_engine_shows_an_unused_one() -> None:
    pool = UpstreamPool()
    kv = KvService(None, children=pool, private=True)
    kv.launch_args("m", ["llama-server"], swa=False)  # steered: its slots are the store's
    assert kv.slots_seen_by("m", 1, "alice", engine_slots()) == [
        {"id": 0, "n_ctx": 2048, "speculative": False, "is_processing": False},
        {"id": 1, "n_ctx": 2048, "speculative": False, "is_processing": False},
    ]  # no map yet: whose tasks, unknown
    slots = SlotMap([0, 1], set(), private=True)
    pool.started("m", 1, 1)  # its child: the owner made, its map as read from GET /slots
    owner = kv.owner("m", 1)
    assert owner is not None
    owner.map = slots
    alice = await slots.claim("", TEXT, "alice")
    assert alice is not None
    assert alice.slot == 0
    slots.release(alice, answered=True)
    seen = kv.slots_seen_by("m", 1, "alice", engine_slots())
    assert seen[0] == engine_slots()[0]
    assert seen[1] == {"id": 1, "n_ctx": 2048, "speculative": False, "is_processing": False}
    assert all("id_task" not in s for s in kv.slots_seen_by("m", 1, "bob", engine_slots()))
    # Another child of the model (a restart): the map is not its.
    assert all("id_task" not in s for s in kv.slots_seen_by("m", 2, "alice", engine_slots()))
    # One tenant: the engine's answer as it is.
    one = KvService(None, children=UpstreamPool())
    assert one.slots_seen_by("m", 1, "", engine_slots()) == engine_slots()
