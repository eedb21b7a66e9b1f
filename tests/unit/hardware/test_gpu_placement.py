"""GPU placement end to end below the actors: a fake NVML (``hw_fakes.FakeNvml``, at
the library boundary) read by the real `MemorySampler`, the real `SchedulerCore`
deciding, its `Spawn` rendered by `gpu_flags`. Children are real idle processes (the
sampler reads their host memory), each "holding" on its cards what its plan says.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterable, Iterator
from types import SimpleNamespace

import attrs
import pytest
from hw_fakes import FakeGpu, FakeNvml

from troupe.actors.memory import MemorySampler
from troupe.child.gpu_flags import gpu_flags
from troupe.hardware.devices import DeviceReader
from troupe.sched import Effect, Reply, SampleMemory, SchedulerCore, Spawn, Stop
from troupe.sched.devices import GpuRequest
from troupe.sched.memory import MemoryLedger
from troupe.sched.reasons import StopReason
from troupe.sched.table import ModelConfig

GiB = 1 << 30
MiB = 1 << 20
HOST_TOTAL = 512 * GiB


class World:
    """troupe's scheduler core over ``sizes`` GiB cards seen through a fake NVML."""

    def __init__(
        self,
        sizes: Iterable[float],
        needs: dict[str, float],
        *,
        margin: int = GiB,
        models_max: int = 0,
        requests: dict[str, GpuRequest] | None = None,
    ) -> None:
        self.gpus = [
            FakeGpu(uuid=f"GPU-{i}", total=int(s * GiB), free=int(s * GiB), used=0)
            for i, s in enumerate(sizes)
        ]
        self.nvml = FakeNvml(self.gpus)
        vm = SimpleNamespace(total=HOST_TOTAL, available=HOST_TOTAL - 8 * GiB)
        self.reader = DeviceReader(self.nvml, virtual_memory=lambda: vm)
        self.sampler = MemorySampler(self.reader)
        names = tuple(f"cuda:{i}" for i in range(len(self.gpus)))
        requests = requests or {}
        configs = [
            ModelConfig(
                n, need={"host": 100 * MiB, "cuda:0": int(g * GiB)}, layers=30, gpu=requests.get(n)
            )
            for n, g in needs.items()
        ]
        self.core = SchedulerCore(configs, models_max, memory=MemoryLedger(margin, gpus=names))
        self.now = 0.0
        self.rid = 0
        self.replies: dict[int, object] = {}
        self.spawns: dict[str, Spawn] = {}
        self.stops: list[Stop] = []
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ids = {name: f"CUDA{i}" for i, name in enumerate(names)}
        self.held_back: set[str] = set()  # spawned, not started: the test does it

    def close(self) -> None:
        for p in self.procs.values():
            p.kill()
            p.wait()
        self.reader.close()

    # ----- carrying out effects, as the actor does -------------------------------------------

    def run(self, effects: Iterable[Effect]) -> None:
        todo = list(effects)
        while todo:
            e = todo.pop(0)
            self.now += 0.01
            if isinstance(e, SampleMemory):
                todo += self.core.memory_sampled(self.sampler.sample(e.pids), e.version, self.now)
            elif isinstance(e, Reply):
                self.replies[e.to] = e.result
            elif isinstance(e, Spawn):
                self.spawns[e.model] = e
                if e.model not in self.held_back:
                    todo += self._start(e)
            elif isinstance(e, Stop):
                self.stops.append(e)
                todo += self._exit(e.model, e.gen)

    def _start(self, spawn: Spawn) -> list[Effect]:
        proc = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(600)"], stdin=subprocess.DEVNULL
        )
        self.procs[spawn.model] = proc
        if spawn.gpu is not None:
            for dev, n in spawn.gpu.need.items():
                if dev.startswith("cuda:"):
                    g = self.gpus[int(dev.split(":")[1])]
                    g.processes.append((proc.pid, n))
                    g.free -= n
                    g.used += n
        out = self.core.spawned(spawn.model, spawn.gen, 9000, proc.pid, self.now)
        return out + self.core.child_state(spawn.model, spawn.gen, "ready", {}, self.now)

    def _exit(self, model: str, gen: int, *, oom: str | None = None) -> list[Effect]:
        proc = self.procs.pop(model)
        proc.kill()
        proc.wait()
        for g in self.gpus:
            for pid, n in list(g.processes):
                if pid == proc.pid:
                    g.processes.remove((pid, n))
                    g.free += n or 0
                    g.used -= n or 0
        return self.core.exited(
            model, gen, 0, self.now, expected=True, oom=oom is not None, oom_device=oom
        )

    # ----- requests -------------------------------------------------------------------------

    def use(self, model: str) -> None:
        """A request for ``model``, served and done."""
        self.rid += 1
        rid = self.rid
        self.now += 1.0
        self.run(self.core.acquire(rid, model, self.now))
        self.run(self.core.release(rid, self.now))

    def devices_of(self, model: str) -> tuple[str, ...]:
        spawn = self.spawns[model]
        assert spawn.gpu is not None, f"{model} was not placed"
        return spawn.gpu.devices

    def running(self) -> set[str]:
        return set(self.core.running_names())


@pytest.fixture
def world() -> Iterator[list[World]]:
    made: list[World] = []
    yield made
    for w in made:
        w.close()


@pytest.mark.parametrize("sizes", [[24, 24], [24, 16, 24, 24, 80, 24, 24, 40]])
def test_two_models_that_each_fit_one_card_run_on_different_cards(
    world: list[World], sizes: list[float]
) -> None:
    w = World(sizes, {"a": 10, "b": 10})
    world.append(w)
    w.use("a")
    w.use("b")
    assert w.running() == {"a", "b"}
    (a,), (b,) = w.devices_of("a"), w.devices_of("b")
    assert a != b
    flags = gpu_flags(w.spawns["a"].gpu, w.ids, lambda _f: False)  # type: ignore[arg-type]
    assert flags == ["--device", w.ids[a]]


@pytest.mark.parametrize(
    ("sizes", "need", "cards"),
    [
        ([24, 24], 30, 2),
        ([24] * 8, 30, 2),
        ([24] * 8, 60, 3),
        ([16, 24, 16, 24, 16, 24, 16, 24], 40, 2),
    ],
)
def test_a_model_too_big_for_one_card_is_split_across_the_fewest(
    world: list[World], sizes: list[float], need: float, cards: int
) -> None:
    w = World(sizes, {"big": need})
    world.append(w)
    w.use("big")
    devices = w.devices_of("big")
    assert len(devices) == cards
    if len(set(sizes)) > 1:
        assert all(sizes[int(d.split(":")[1])] == max(sizes) for d in devices)  # the roomiest
    plan = w.spawns["big"].gpu
    assert plan is not None
    flags = gpu_flags(plan, w.ids, lambda _f: False)
    assert flags[:2] == ["--device", ",".join(w.ids[d] for d in devices)]
    assert flags[2:4] == ["--split-mode", "layer"]
    assert flags[4] == "--tensor-split"
    assert len(flags[5].split(",")) == cards


@pytest.mark.parametrize("sizes", [[24, 24], [24] * 8])
def test_a_model_is_never_placed_where_the_margin_says_it_does_not_fit(
    world: list[World], sizes: list[float]
) -> None:
    # 23.5 GiB fits a 24 GiB card, not with a 1 GiB margin: two cards, each keeping it
    w = World(sizes, {"a": 23.5}, margin=GiB)
    world.append(w)
    w.use("a")
    assert len(w.devices_of("a")) == 2
    for g in w.gpus:
        assert g.free >= GiB
    # and a second one that fits nowhere with the margin waits for the first to go
    w2 = World([24], {"a": 12, "b": 12}, margin=GiB)
    world.append(w2)
    w2.use("a")
    w2.use("b")
    assert w2.running() == {"b"}
    assert [s.cause.reason for s in w2.stops] == [StopReason.MEMORY]
    assert w2.gpus[0].free >= GiB


@pytest.mark.parametrize("sizes", [[24, 16], [24, 16, 16, 16, 16, 16, 16, 16]])
def test_eviction_frees_the_card_that_needs_it(world: list[World], sizes: list[float]) -> None:
    """c fits only the 24 GiB card: a goes (on that card), though the others were used
    longer ago (LRU alone would pick one of them, freeing a card c cannot use)."""
    fill = {f"f{i}": 12 for i in range(1, len(sizes))}
    w = World(sizes, {"a": 14, **fill, "c": 20})
    world.append(w)
    w.use("a")
    for name in fill:
        w.use(name)
    w.use("a")  # a is the most recently used
    assert w.devices_of("a") == ("cuda:0",)
    assert {w.devices_of(f)[0] for f in fill} == {f"cuda:{i}" for i in range(1, len(sizes))}
    assert w.running() == {"a", *fill}
    w.use("c")
    assert [s.model for s in w.stops] == ["a"]
    assert w.running() == {"c", *fill}
    assert w.devices_of("c") == ("cuda:0",)


def test_an_oom_on_a_card_evicts_only_what_is_on_that_card(world: list[World]) -> None:
    w = World([24, 24], {"a": 8, "b": 8, "c": 8})
    world.append(w)
    w.use("a")
    w.use("b")
    a_card = w.devices_of("a")[0]
    # c loads beside them, and dies of OOM on a's card
    w.held_back.add("c")
    w.rid += 1
    w.run(w.core.acquire(w.rid, "c", w.now))
    spawn = w.spawns["c"]
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    w.procs["c"] = proc
    w.run(w.core.spawned("c", spawn.gen, 9001, proc.pid, w.now))
    w.procs.pop("c").kill()
    proc.wait()
    w.run(w.core.exited("c", spawn.gen, 1, w.now, expected=False, oom=True, oom_device=a_card))
    assert [s.model for s in w.stops] == ["a"]  # b, on the other card, stays
    assert "b" in w.running()


def test_one_too_big_for_every_card_together_is_offloaded_in_part(world: list[World]) -> None:
    w = World([8, 8], {"huge": 40})
    world.append(w)
    w.use("huge")
    plan = w.spawns["huge"].gpu
    assert plan is not None
    assert plan.layers is not None
    assert 0 < plan.layers < 30
    flags = gpu_flags(plan, w.ids, lambda _f: False)
    assert flags[-2:] == ["--n-gpu-layers", str(plan.layers)]
    assert all(g.free >= GiB for g in w.gpus)


def test_a_models_own_device_flags_are_kept_and_counted(world: list[World]) -> None:
    w = World([24, 24], {"mine": 20, "b": 20}, requests={"mine": GpuRequest(("cuda:1",))})
    world.append(w)
    w.use("mine")
    plan = w.spawns["mine"].gpu
    assert plan is not None
    assert plan.fixed  # placed by its flags: counted there
    assert gpu_flags(plan, w.ids, lambda _f: False) == []  # troupe adds none
    assert w.core.ledger is not None
    assert w.core.ledger.holds_on("mine", ["cuda:1"])
    assert not w.core.ledger.holds_on("mine", ["cuda:0"])
    w.use("b")  # counted on cuda:1, so b goes to cuda:0 beside it
    assert w.devices_of("b") == ("cuda:0",)
    assert w.running() == {"mine", "b"}


def test_one_card_and_no_card(world: list[World]) -> None:
    w = World([16], {"a": 4, "b": 4})
    world.append(w)
    w.use("a")
    w.use("b")
    assert w.devices_of("a") == w.devices_of("b") == ("cuda:0",)
    # No GPU (no NVML): nothing placed, no device flag
    w0 = World([], {"a": 0})
    world.append(w0)
    w0.use("a")
    assert w0.spawns["a"].gpu is None


def test_models_shows_each_childs_cards(world: list[World]) -> None:
    from troupe.http.models_json import _gpu  # noqa: PLC0415  (the /models field itself)

    w = World([24, 24], {"a": 10, "big": 30, "mine": 4}, requests={"mine": GpuRequest(None)})
    world.append(w)
    w.use("a")
    views = w.core.snapshot().models
    assert _gpu(views["a"]) == {"placed_by": "troupe", "devices": list(w.devices_of("a"))}
    assert _gpu(views["big"]) is None  # not running
    assert _gpu(views["mine"]) == {"placed_by": "flags", "devices": None}
    w.run(w.core.unload(99, "a", w.now))
    assert w.running() == set()
    w.use("big")
    shown = _gpu(w.core.snapshot().models["big"])
    assert shown is not None
    assert shown["devices"] == ["cuda:0", "cuda:1"]
    assert len(shown["tensor_split"]) == 2


def test_room_a_pinned_model_holds_is_not_waited_for(world: list[World]) -> None:
    """big would fit the card only without pinned p on it: it is offloaded in part now
    instead of waiting for an eviction that never comes."""
    w = World([24], {"p": 10, "big": 20})
    world.append(w)
    w.core.table.models["p"].config = attrs.evolve(w.core.table.models["p"].config, pin=True)
    w.use("p")
    w.use("big")
    assert w.running() == {"p", "big"}
    plan = w.spawns["big"].gpu
    assert plan is not None
    assert plan.layers is not None
    assert w.gpus[0].free >= GiB
