"""The scheduler core's state machine, with GPUs: 1 to 8 cards of different sizes,
models of different needs loaded, used, unloaded and dying of OOM on a card in any
order. Each child really takes on each card what its plan says; the machine checks
that no load ever takes a card past the margin, and that the ledger counts on each
card what is there."""

from __future__ import annotations

from collections.abc import Iterable

import hypothesis.strategies as st
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from troupe.sched import Effect, Reply, SampleMemory, SchedulerCore, Spawn, Stop
from troupe.sched.memory import DeviceMemory, MemoryLedger, MemorySample
from troupe.sched.table import ModelConfig

GiB = 1 << 30
MARGIN = GiB
NAMES = ("a", "b", "c", "d", "e")


class GpuMachine(RuleBasedStateMachine):
    @initialize(
        sizes=st.lists(st.sampled_from([8, 16, 24, 40, 80]), min_size=1, max_size=8),
        needs=st.lists(st.integers(1, 120), min_size=len(NAMES), max_size=len(NAMES)),
        models_max=st.integers(0, 3),
    )
    def setup(self, sizes: list[int], needs: list[int], models_max: int) -> None:
        self.total = {f"cuda:{i}": s * GiB for i, s in enumerate(sizes)}
        self.used = dict.fromkeys(self.total, 0)
        self.on: dict[str, dict[str, int]] = {}  # model -> what its child takes per card
        configs = [
            ModelConfig(n, need={"host": GiB // 10, "cuda:0": g * GiB // 2}, layers=40)
            for n, g in zip(NAMES, needs, strict=True)
        ]
        ledger = MemoryLedger(MARGIN, gpus=tuple(self.total))
        self.core = SchedulerCore(configs, models_max, memory=ledger)
        self.now = 0.0
        self.rid = 0
        self.pids: dict[str, int] = {}
        self.gens: dict[str, int] = {}
        self.next_pid = 100
        self.pending: list[int] = []
        self.overfull: list[str] = []

    def _sample(self) -> MemorySample:
        devices = [DeviceMemory("host", 1 << 44, 1 << 43)]
        devices += [DeviceMemory(d, t, t - self.used[d]) for d, t in self.total.items()]
        usage = {self.pids[m]: dict(per) for m, per in self.on.items() if m in self.pids}
        return MemorySample(tuple(devices), usage, usage)

    def _run(self, effects: Iterable[Effect]) -> None:
        todo = list(effects)
        while todo:
            e = todo.pop(0)
            self.now += 0.01
            if isinstance(e, SampleMemory):
                todo += self.core.memory_sampled(self._sample(), e.version, self.now)
            elif isinstance(e, Spawn):
                todo += self._start(e)
            elif isinstance(e, Stop):
                todo += self._gone(e.model, e.gen)
            elif isinstance(e, Reply) and e.to in self.pending:
                todo += self.core.release(e.to, self.now)
                self.pending.remove(e.to)

    def _start(self, spawn: Spawn) -> list[Effect]:
        self.next_pid += 1
        self.pids[spawn.model] = self.next_pid
        self.gens[spawn.model] = spawn.gen
        take = {}
        if spawn.gpu is not None:
            take = {d: n for d, n in spawn.gpu.need.items() if d != "host"}
        for d, n in take.items():
            self.used[d] += n
            if self.used[d] + MARGIN > self.total[d]:
                self.overfull.append(f"{spawn.model} took {d} past the margin")
        self.on[spawn.model] = take
        out = self.core.spawned(spawn.model, spawn.gen, 9000, self.next_pid, self.now)
        return out + self.core.child_state(spawn.model, spawn.gen, "ready", {}, self.now)

    def _gone(self, model: str, gen: int, *, oom: str | None = None) -> list[Effect]:
        for d, n in self.on.pop(model, {}).items():
            self.used[d] -= n
        self.pids.pop(model, None)
        return self.core.exited(
            model,
            gen,
            1 if oom else 0,
            self.now,
            expected=oom is None,
            oom=bool(oom),
            oom_device=oom,
        )

    @rule(model=st.sampled_from(NAMES))
    def request(self, model: str) -> None:
        self.rid += 1
        self.now += 1.0
        self.pending.append(self.rid)
        self._run(self.core.acquire(self.rid, model, self.now))

    @rule(model=st.sampled_from(NAMES))
    def unload(self, model: str) -> None:
        self.rid += 1
        self._run(self.core.unload(self.rid, model, self.now))

    @rule(model=st.sampled_from(NAMES), data=st.data())
    def dies_of_oom(self, model: str, data: st.DataObject) -> None:
        if model not in self.pids:
            return
        cards = sorted(self.on.get(model, {})) or [None]
        card = data.draw(st.sampled_from(cards))
        self._run(self._gone(model, self.gens[model], oom=card))

    @invariant()
    def no_card_past_the_margin(self) -> None:
        assert not self.overfull, self.overfull

    @invariant()
    def the_ledger_counts_what_is_on_each_card(self) -> None:
        ledger = self.core.ledger
        assert ledger is not None
        running = set(self.core.running_names())
        for model, take in self.on.items():
            if model in running and take:
                held = ledger.holding(model) or {}
                assert {d: n for d, n in held.items() if d != "host"} == take


TestGpuMachine = GpuMachine.TestCase
TestGpuMachine.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
