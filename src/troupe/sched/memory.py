"""The memory ledger (pure): what every model holds on every device, and what is free.

Figures are bytes per device name ("host", "cuda:0", ...). For each device:

* external = total - free - tracked, where tracked is what our children really use
  now (sampled per process) and "free" does not count as reclaimable, so memory other
  programs use is never ours to give (on the host "free" is MemAvailable, which already
  counts a child's clean mapped weight pages; only its anonymous memory is added back);
* held = for each running model, its effective use once it is up, else its
  estimate (a reservation made at admission, so two loads never spend the same bytes);
* available = total - external - held = free + tracked - held;
* deficit(new model) = need + margin - available, positive where memory must be freed.

A model with no estimate ("settled, unknown") is admitted without the check and its
effective use is learnt once it is up.

With GPUs to place children on (``gpus``), `fit` also says where a model goes
(`troupe.sched.devices`): its GPU part is re-placed at every load, whatever GPUs it
was seen on before, and a placed child holds what its plan says (``where``) until a
reading says what it really holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from troupe.sched.devices import HOST, Fit, GpuPlan, GpuRequest, gpu_part, place, spread

__all__ = ["DeviceMemory", "MemoryLedger", "MemorySample", "PerDevice"]

PerDevice = Mapping[str, int]


@attrs.frozen
class DeviceMemory:
    name: str
    total: int
    free: int


@attrs.frozen
class MemorySample:
    """One reading: every device, and what each child process uses on each device."""

    devices: tuple[DeviceMemory, ...]
    # pid -> device -> bytes the device's "free" does not already count as reclaimable
    # (on the host: anonymous memory; a GPU: everything the process holds)
    usage: Mapping[int, PerDevice] = attrs.field(factory=dict)
    # pid -> device -> everything the process holds (host: its RSS, mapped weights too)
    footprint: Mapping[int, PerDevice] = attrs.field(factory=dict)
    # GPUs whose per-process use NVML could not tell (no process list, or a container
    # that sees the host's PIDs): what children hold there is taken from the ledger
    blind: frozenset[str] = frozenset()

    def device(self, name: str) -> DeviceMemory | None:
        return next((d for d in self.devices if d.name == name), None)


def _add(into: dict[str, int], more: PerDevice, sign: int = 1) -> None:
    for dev, n in more.items():
        into[dev] = into.get(dev, 0) + sign * n


@attrs.define
class MemoryLedger:
    margin: int  # bytes kept free on every device
    estimates: dict[str, PerDevice] = attrs.field(factory=dict)  # model -> need before loading
    effective: dict[str, PerDevice] = attrs.field(factory=dict)  # model -> measured once up
    # GPUs troupe places children on (empty: none, or --gpu-placement off)
    gpus: tuple[str, ...] = ()
    # model -> what its placed child is counted as holding per device (its plan, then
    # what a reading saw), while it runs
    where: dict[str, PerDevice] = attrs.field(factory=dict)
    # model -> the plan admission found for it, until its spawn takes it
    planned: dict[str, GpuPlan] = attrs.field(factory=dict)

    def set_estimate(self, model: str, need: PerDevice | None) -> None:
        if need is None:
            self.estimates.pop(model, None)
        else:
            self.estimates[model] = dict(need)

    def need(self, model: str) -> PerDevice | None:
        """What loading ``model`` takes: what it used last time, else the estimate."""
        return self.effective.get(model) or self.estimates.get(model)

    def true_up(self, model: str, used: PerDevice, blind: frozenset[str] = frozenset()) -> None:
        """The child is up: from now on it holds what it really uses. On a GPU in
        ``blind`` (its use could not be read) it keeps the figure it had."""
        if any(used.values()):
            seen = dict(used)
            prior = self.where.get(model) or self.need(model) or {}
            for dev, n in prior.items():
                if dev in blind and dev not in seen:
                    seen[dev] = n
            self.effective[model] = seen
            if model in self.where:
                self.where[model] = seen

    def holding(self, model: str) -> PerDevice | None:
        """What a running model is counted as holding: its placement's, else its need."""
        return self.where.get(model) or self.need(model)

    def held(self, running: Iterable[str]) -> dict[str, int]:
        total: dict[str, int] = {}
        for model in running:
            need = self.holding(model)
            if need:
                _add(total, need)
        return total

    def holds_on(self, model: str, devices: Iterable[str]) -> bool:
        """Does running ``model`` hold memory on any of ``devices``?"""
        need = self.holding(model) or {}
        return any(need.get(dev, 0) > 0 for dev in devices)

    def spawned(self, model: str, plan: GpuPlan | None) -> None:
        """``model``'s child starts on ``plan`` (None: not placed by troupe)."""
        if plan is None:
            self.where.pop(model, None)
        else:
            self.where[model] = dict(plan.need)

    def available(self, sample: MemorySample, running: Mapping[str, int]) -> dict[str, int]:
        """Per device: free + what our children use now - what we account for them.

        ``running`` maps each model holding memory (loading, loaded; not sleeping) to
        its pid (0 when not started yet)."""
        tracked, held = self._tracked(sample, running)
        out = {}
        for dev in sample.devices:
            out[dev.name] = dev.free + tracked.get(dev.name, 0) - held.get(dev.name, 0)
        return out

    def _tracked(
        self, sample: MemorySample, running: Mapping[str, int]
    ) -> tuple[dict[str, int], dict[str, int]]:
        """(what the children use now per device, what the ledger counts for them)."""
        tracked: dict[str, int] = {}
        for pid in running.values():
            _add(tracked, sample.usage.get(pid, {}))
        held = self.held(running)
        for dev in sample.blind:
            # NVML cannot tell whose memory it is: troupe's children use what they hold,
            # at most what the card has in use.
            d = sample.device(dev)
            if d is not None:
                tracked[dev] = min(held.get(dev, 0), max(0, d.total - d.free))
        return tracked, held

    def deficit(
        self, model: str, sample: MemorySample, running: Mapping[str, int]
    ) -> dict[str, int] | None:
        """Bytes to free per device before ``model`` fits with the margin (empty when it
        fits); None when its need is unknown."""
        fit = self.fit(model, sample, running)
        if fit is None:
            return None
        return dict(fit.short[0]) if fit.short else {}

    def fit(
        self,
        model: str,
        sample: MemorySample,
        running: Mapping[str, int],
        request: GpuRequest | None = None,
        layers: int | None = None,
        kept: Iterable[str] = (),
    ) -> Fit | None:
        """Where ``model`` goes now and what must be freed first (`Fit`); None when its
        need is unknown. ``request``: its own device flags (then it is not placed, and
        counted on the devices they name); ``layers``: its layer count; ``kept``: models
        never evicted (pinned): their room is not counted as room that could be freed."""
        need = self.need(model)
        if need is None:
            return None
        others = {m: p for m, p in running.items() if m != model}
        available = self.available(sample, others)
        plan: GpuPlan | None = None
        if request is not None:
            need = self.counted(need, request)
            if request.devices is not None:
                plan = GpuPlan(request.devices, need=need, fixed=True)
        elif self.gpus:
            tracked, _ = self._tracked(sample, others)
            capacity = {
                d.name: d.free + tracked.get(d.name, 0) for d in sample.devices if d.name != HOST
            }
            for pinned in kept:
                if pinned in others:
                    for dev, n in (self.holding(pinned) or {}).items():
                        if dev in capacity:
                            capacity[dev] -= n
            sharing: dict[str, int] = {}
            for other in others:
                for dev, n in (self.holding(other) or {}).items():
                    if dev != HOST and n > 0:
                        sharing[dev] = sharing.get(dev, 0) + 1
            found = place(need, available, capacity, self.gpus, self.margin, layers, sharing)
            if found.short:
                host_short = self._short({HOST: need.get(HOST, 0)}, available)
                shorts = tuple({**host_short, **s} for s in found.short)
                meanwhile = found.plan
                if meanwhile is not None and self._short(meanwhile.need, available):
                    meanwhile = None
                return Fit(meanwhile, shorts, meanwhile=meanwhile is not None)
            if found.plan is not None:
                plan = found.plan
                need = plan.need
        short = self._short(need, available)
        return Fit(plan, (short,) if short else ())

    def counted(self, need: PerDevice, request: GpuRequest) -> PerDevice:
        """``need`` on the devices a model's own flags name: as it is when it names them
        already (the engine's projection for those flags), else its GPU part spread over
        them; nothing on a GPU for ``--device none``."""
        named = request.devices
        if named is None:
            return need
        host, gpu = gpu_part(need)
        if not named:
            return {HOST: host + gpu}
        if all(dev == HOST or dev in named for dev, n in need.items() if n > 0):
            return need
        out = spread(gpu, named, tuple(1 for _ in named))
        out[HOST] = host
        return out

    def _short(self, need: PerDevice, available: Mapping[str, int]) -> dict[str, int]:
        short = {}
        for dev, n in need.items():
            if n <= 0:
                continue
            missing = n + self.margin - available.get(dev, 0)
            if missing > 0:
                short[dev] = missing
        return short
