"""Where a child's GPU part goes (`troupe.sched.devices.place`), the pure arithmetic."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given

from troupe.sched.devices import GpuRequest, place, spread
from troupe.sched.memory import DeviceMemory, MemoryLedger, MemorySample

GiB = 1 << 30
MiB = 1 << 20


def cards(*free_gib: float) -> dict[str, int]:
    return {f"cuda:{i}": int(f * GiB) for i, f in enumerate(free_gib)}


def test_a_model_that_fits_one_card_gets_the_roomiest_one() -> None:
    room = cards(10, 20, 15)
    fit = place({"host": GiB, "cuda:0": 8 * GiB}, room, room, list(room), GiB, 40)
    assert fit.plan is not None
    assert fit.plan.devices == ("cuda:1",)
    assert fit.plan.split == ()
    assert fit.plan.layers is None
    assert fit.plan.need == {"cuda:1": 8 * GiB, "host": GiB}


def test_a_model_too_big_for_one_card_gets_the_fewest_split_by_their_room() -> None:
    room = cards(24, 24, 12, 24, 24, 24, 24, 24)
    fit = place({"cuda:0": 40 * GiB}, room, room, list(room), GiB, 40)
    assert fit.plan is not None
    assert fit.plan.devices == ("cuda:0", "cuda:1")  # two, not three
    assert fit.plan.split == (23 * 1024, 23 * 1024)
    assert sum(fit.plan.need.values()) == 40 * GiB
    fit = place({"cuda:0": 50 * GiB}, room, room, list(room), GiB, 40)
    assert fit.plan is not None
    assert len(fit.plan.devices) == 3


def test_one_that_fits_once_room_is_freed_asks_for_it_on_the_card_it_would_use() -> None:
    room = cards(4, 6)
    capacity = cards(24, 16)
    fit = place({"cuda:0": 20 * GiB}, room, capacity, list(room), GiB, 40)
    assert fit.plan is None
    assert fit.short == ({"cuda:0": 17 * GiB},)  # only card 0 can ever hold it


def test_one_no_combination_holds_is_offloaded_in_part() -> None:
    room = cards(8, 8)
    fit = place({"host": GiB, "cuda:0": 40 * GiB}, room, room, list(room), GiB, 41)
    assert fit.plan is not None
    assert fit.plan.devices == ("cuda:0", "cuda:1")
    assert fit.plan.layers is not None
    assert 0 < fit.plan.layers < 41
    on_gpu = fit.plan.need["cuda:0"] + fit.plan.need["cuda:1"]
    assert on_gpu <= 14 * GiB
    assert on_gpu + fit.plan.need["host"] == 41 * GiB  # the rest stays on the host


def test_counted_on_the_devices_its_own_flags_name() -> None:
    ledger = MemoryLedger(0, gpus=("cuda:0", "cuda:1"))
    need = {"host": GiB, "cuda:0": 4 * GiB}
    assert ledger.counted(need, GpuRequest(("cuda:1",))) == {"cuda:1": 4 * GiB, "host": GiB}
    assert ledger.counted(need, GpuRequest(())) == {"host": 5 * GiB}
    assert ledger.counted(need, GpuRequest(None)) == need


def test_a_gpu_nvml_cannot_see_into_keeps_the_figure_it_had() -> None:
    ledger = MemoryLedger(0, gpus=("cuda:0",))
    ledger.set_estimate("a", {"host": GiB, "cuda:0": 4 * GiB})
    ledger.true_up("a", {"host": 2 * GiB}, blind=frozenset({"cuda:0"}))
    assert ledger.need("a") == {"host": 2 * GiB, "cuda:0": 4 * GiB}
    ledger.true_up("a", {"host": 2 * GiB})  # seen: it holds nothing there
    assert ledger.need("a") == {"host": 2 * GiB}


def test_on_a_blind_card_a_childs_use_is_taken_from_the_ledger() -> None:
    ledger = MemoryLedger(0, gpus=("cuda:0",))
    ledger.set_estimate("a", {"cuda:0": 4 * GiB})
    sample = MemorySample(
        (DeviceMemory("host", 64 * GiB, 60 * GiB), DeviceMemory("cuda:0", 24 * GiB, 19 * GiB)),
        blind=frozenset({"cuda:0"}),
    )
    # 5 GiB in use, 4 of them a's: 1 GiB someone else's; 20 GiB would be free without a
    assert ledger.available(sample, {"a": 7})["cuda:0"] == 19 * GiB + 4 * GiB - 4 * GiB


@given(
    st.lists(st.integers(0, 80), min_size=1, max_size=8),
    st.integers(1, 200),
    st.integers(0, 4),
)
def test_never_placed_where_the_margin_says_it_does_not_fit(
    free_gib: list[int], need_gib: int, margin_gib: int
) -> None:
    room = {f"cuda:{i}": f * GiB for i, f in enumerate(free_gib)}
    margin = margin_gib * GiB
    fit = place({"host": GiB, "cuda:0": need_gib * GiB}, room, room, list(room), margin, 30)
    if fit.plan is None:
        assert fit.short  # it asks for room instead
        return
    for dev, n in fit.plan.need.items():
        if dev != "host":
            assert n + margin <= room[dev], (dev, n, room[dev])
    if fit.plan.layers is None:
        # whole: on the fewest cards that can hold it
        assert sum(v for d, v in fit.plan.need.items() if d != "host") == need_gib * GiB
        fewer = sorted((r - margin for r in room.values()), reverse=True)
        k = len(fit.plan.devices)
        assert sum(max(0, r) for r in fewer[: k - 1]) < need_gib * GiB + k - 1


def test_spread_keeps_every_byte() -> None:
    assert sum(spread(10**9 + 7, ("a", "b", "c"), (3, 2, 2)).values()) == 10**9 + 7
