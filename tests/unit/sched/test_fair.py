"""Fair queuing across tenants (`troupe.sched.fair`): the pure part alone, then through
`SchedulerCore` (the slot cap, class priority, least attained service, max_parallel,
requests that take no slot, a slot waiter whose child goes)."""

from __future__ import annotations

import math

import pytest
from schedcore_kit import Bench, answered, grant_of, replies, reply_to, spawns

from troupe.sched import Failure, Grant
from troupe.sched.fair import DEFAULT_SLOTS, HALF_LIFE, MAX_BYPASS, TENANT_DEMAND_CAP, Fair
from troupe.sched.terms import TenantTerms

ALICE = TenantTerms("alice")
BOB = TenantTerms("bob")
CAROL = TenantTerms("carol")


# ----- the pure part -------------------------------------------------------------------------


def test_attained_service_halves_every_half_life_and_unknown_answers_cost_the_typical() -> None:
    fair = Fair()
    fair.serve("alice", 1000, now=0.0)
    assert fair.attained("alice", 0.0) == 1000
    assert fair.attained("alice", HALF_LIFE) == pytest.approx(500)
    assert fair.attained("alice", 2 * HALF_LIFE) == pytest.approx(250)
    assert fair.attained("nobody", 5.0) == 0.0
    # the typical answer follows the known ones; an unknown answer is charged it
    b = Bench(["a"])
    b.bring_up("a")
    f = b.core.fair
    for tokens in (100, 300):
        rid = b.rid()
        grant_of(b.acquire(rid, "a", terms=ALICE, slot=True), rid)
        b.core.release(rid, b.tick(0.0), tokens)
    assert f.typical == pytest.approx(200)
    rid = b.rid()
    grant_of(b.acquire(rid, "a", terms=BOB, slot=True), rid)
    b.core.release(rid, b.tick(0.0), None)
    assert f.attained("bob", b.now) == pytest.approx(200)


def test_share_counts_requests_in_flight_and_divides_by_weight() -> None:
    b = Bench(["a"])
    b.bring_up("a")
    f = b.core.fair
    heavy = TenantTerms("heavy", weight=2.0)
    rid = b.rid()
    grant_of(b.acquire(rid, "a", terms=heavy, slot=True), rid)
    assert f.share(heavy, b.now) == pytest.approx(f.typical / 2)
    b.core.release(rid, b.now, 400)
    assert f.share(heavy, b.now) == pytest.approx(200)


def test_one_tenants_flood_weighs_at_most_the_cap_in_a_models_demand() -> None:
    fair = Fair()
    steps = [fair.demand_step("a", ALICE, 0.0) for _ in range(10)]
    assert sum(steps) == pytest.approx(TENANT_DEMAND_CAP)
    assert fair.demand_step("a", BOB, 0.0) == 1.0  # another tenant still counts whole
    # no keys: the one tenant "" is everyone, and counts as before
    assert [fair.demand_step("a", TenantTerms(), 0.0) for _ in range(10)] == [1.0] * 10
    # decayed, the flood's share has room again
    later = fair.demand_step("a", ALICE, 600.0)
    assert later == pytest.approx(1.0)


# ----- through the core ----------------------------------------------------------------------


def fill(b: Bench, model: str, terms: TenantTerms, n: int) -> list[int]:
    """``n`` slot-using leases of ``terms`` granted at once; their rids."""
    rids = []
    for _ in range(n):
        rid = b.rid()
        grant_of(b.acquire(rid, model, terms=terms, slot=True), rid)
        rids.append(rid)
    return rids


def queue(b: Bench, model: str, terms: TenantTerms, n: int) -> list[int]:
    """``n`` slot-using requests of ``terms`` that must wait; their rids."""
    rids = []
    for _ in range(n):
        rid = b.rid()
        assert not b.core.grants_at_once(model, terms=terms, slot=True)
        assert b.acquire(rid, model, terms=terms, slot=True) == []
        rids.append(rid)
    return rids


def test_a_loaded_model_grants_no_more_slot_leases_than_its_child_has_slots() -> None:
    b = Bench(["a"])
    b.bring_up("a")  # the child said nothing of its slots: llama-server's default
    held = fill(b, "a", ALICE, DEFAULT_SLOTS)
    waiting = queue(b, "a", ALICE, 2)
    assert b.view("a").in_flight == DEFAULT_SLOTS
    out = b.release(held[0])
    assert answered(out) == {waiting[0]}
    assert grant_of(out, waiting[0]).waited
    out = b.release(held[1])
    assert answered(out) == {waiting[1]}


def test_the_childs_own_slot_count_is_the_cap() -> None:
    b = Bench(["a"])
    rid = b.rid()
    b.load(rid, "a")
    b.core.spawned("a", b.gen["a"], 40001, 50001, b.tick(), slots=2)
    b.ready("a")
    fill(b, "a", ALICE, 2)
    queue(b, "a", ALICE, 1)


def test_requests_that_take_no_slot_never_wait_behind_those_that_do() -> None:
    """/tokenize, /props, /health...: granted at once while every slot is taken and
    others wait for one (the lease says it takes no slot)."""
    b = Bench(["a"])
    b.bring_up("a")
    fill(b, "a", ALICE, DEFAULT_SLOTS)
    queue(b, "a", ALICE, 3)
    rid = b.rid()
    assert b.core.grants_at_once("a", terms=BOB, slot=False)
    grant_of(b.acquire(rid, "a", terms=BOB, slot=False), rid)
    assert b.view("a").in_flight == DEFAULT_SLOTS + 1
    out = b.release(rid)  # frees no slot: nobody waiting is granted
    assert replies(out) == []


def test_the_next_slot_goes_to_the_tenant_with_the_least_attained_service() -> None:
    b = Bench(["a"])
    b.bring_up("a")
    held = fill(b, "a", ALICE, DEFAULT_SLOTS)
    flood = queue(b, "a", ALICE, 5)
    bob = queue(b, "a", BOB, 1)
    out = b.release(held[0])
    assert answered(out) == set(bob)  # bob has had nothing; alice has 4 in flight
    out = b.release(held[1])
    assert answered(out) == {flood[0]}  # then alice's, in arrival order


def test_weight_divides_attained_service() -> None:
    b = Bench(["a"])
    b.bring_up("a")
    heavy, light = TenantTerms("heavy", weight=4.0), TenantTerms("light", weight=1.0)
    for terms, tokens in ((heavy, 1000), (light, 400)):
        rid = b.rid()
        grant_of(b.acquire(rid, "a", terms=terms, slot=True), rid)
        b.core.release(rid, b.tick(0.0), tokens)
    held = fill(b, "a", CAROL, DEFAULT_SLOTS)
    first_light = queue(b, "a", light, 1)
    first_heavy = queue(b, "a", heavy, 1)
    out = b.core.release(held[0], b.tick(0.0), 0)
    # heavy: 1000 / 4 = 250 per weight < light: 400 / 1
    assert {r.to for r in replies(out)} == set(first_heavy)
    out = b.core.release(held[1], b.tick(0.0), 0)
    assert {r.to for r in replies(out)} == set(first_light)


def test_class_priority_goes_first_and_reserved_slots_are_kept_for_it() -> None:
    b = Bench(["a"])
    b.bring_up("a")
    batch = TenantTerms("batch", priority=0, held_back=1)
    interactive = TenantTerms("ui", priority=10, reserved_slots=1)
    held = fill(b, "a", batch, DEFAULT_SLOTS - 1)  # the last slot is kept for "ui"
    late = queue(b, "a", batch, 2)
    rid = b.rid()
    assert b.core.grants_at_once("a", terms=interactive, slot=True)
    grant_of(b.acquire(rid, "a", terms=interactive, slot=True), rid)
    # all taken; a ui request that comes later still goes before batch's queue
    ui = queue(b, "a", interactive, 1)
    out = b.release(held[0])
    assert answered(out) == set(ui)
    out = b.release(rid)  # ui still holds a slot (its reservation): batch may take this
    assert answered(out) == {late[0]}
    out = b.release(ui[0])  # ui holds none now: the free slot is kept for it
    assert replies(out) == []
    assert b.core.grants_at_once("a", terms=interactive, slot=True)
    assert not b.core.grants_at_once("a", terms=batch, slot=True)
    out = b.release(held[1])  # two free: batch takes one, one stays kept
    assert answered(out) == {late[1]}


def test_max_parallel_is_never_exceeded_and_others_are_served_meanwhile() -> None:
    b = Bench(["a", "b"])
    b.bring_up("a")
    b.bring_up("b")
    capped = TenantTerms("capped", max_parallel=2)
    fill(b, "a", capped, 1)
    fill(b, "b", capped, 1)  # max_parallel counts every model
    wait = queue(b, "a", capped, 1)  # a slot is free, but not for it
    rid = b.rid()
    grant_of(b.acquire(rid, "a", terms=BOB, slot=True), rid)  # others are not held up
    assert not answered(b.release(rid)) & set(wait)
    (held_b,) = [r for r, lease in b.core.requests.leases.items() if lease.model == "b"]
    out = b.release(held_b)
    assert answered(out) == set(wait)


def test_no_backlogged_tenant_is_passed_over_more_than_max_bypass_times() -> None:
    """A tenant far behind in service waits at most MAX_BYPASS grants to others."""
    b = Bench(["a"])
    b.bring_up("a")
    rid = b.rid()
    grant_of(b.acquire(rid, "a", terms=ALICE, slot=True), rid)
    b.core.release(rid, b.tick(0.0), 10**9)  # alice has been served a great deal
    held = fill(b, "a", CAROL, DEFAULT_SLOTS)
    (alice,) = queue(b, "a", ALICE, 1)
    others = queue(b, "a", BOB, MAX_BYPASS + 5)
    granted: list[int] = []
    for rid in [*held, *others]:
        out = b.core.release(rid, b.tick(0.0), 0)
        granted += [r.to for r in replies(out)]
        if alice in granted:
            break
    assert alice in granted
    assert granted.index(alice) == MAX_BYPASS


def test_a_slot_waiter_whose_child_dies_asks_the_next_one() -> None:
    b = Bench(["a"])
    b.bring_up("a")
    fill(b, "a", ALICE, DEFAULT_SLOTS)
    (rid,) = queue(b, "a", BOB, 1)
    out = b.exited("a", 1, expected=False)
    assert rid not in answered(out)
    assert [s.model for s in spawns(out)] == ["a"]  # it loads the model again
    b.spawned("a")
    out = b.ready("a")
    grant = reply_to(out, rid)
    assert isinstance(grant, Grant)
    assert grant.gen == b.gen["a"]


def test_a_slot_waiter_that_may_not_load_fails_when_its_child_goes() -> None:
    b = Bench(["a"])
    b.bring_up("a")
    fill(b, "a", ALICE, DEFAULT_SLOTS)
    rid = b.rid()
    assert b.acquire(rid, "a", terms=BOB, slot=True, autoload=False) == []
    out = b.exited("a", 1, expected=False)
    assert reply_to(out, rid) == Failure.bad_request("model is not loaded")


def test_without_tenants_requests_keep_their_arrival_order() -> None:
    b = Bench(["a"])
    b.bring_up("a")
    held = fill(b, "a", TenantTerms(), DEFAULT_SLOTS)
    waiting = queue(b, "a", TenantTerms(), 6)
    granted = []
    for rid in held + waiting[:2]:
        granted += [r.to for r in replies(b.release(rid))]
    assert granted == waiting


def test_decay_lets_an_old_flood_be_forgotten() -> None:
    fair = Fair()
    fair.serve("alice", 10_000, 0.0)
    fair.serve("bob", 100, 0.0)
    later = 10 * HALF_LIFE
    assert fair.attained("alice", later) == pytest.approx(10_000 * math.pow(2, -10))
    assert fair.attained("alice", later) < fair.attained("bob", 0.0)
