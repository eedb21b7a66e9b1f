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
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

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

    def set_estimate(self, model: str, need: PerDevice | None) -> None:
        if need is None:
            self.estimates.pop(model, None)
        else:
            self.estimates[model] = dict(need)

    def need(self, model: str) -> PerDevice | None:
        """What loading ``model`` takes: what it used last time, else the estimate."""
        return self.effective.get(model) or self.estimates.get(model)

    def true_up(self, model: str, used: PerDevice) -> None:
        """The child is up: from now on it holds what it really uses."""
        if any(used.values()):
            self.effective[model] = dict(used)

    def held(self, running: Iterable[str]) -> dict[str, int]:
        total: dict[str, int] = {}
        for model in running:
            need = self.need(model)
            if need:
                _add(total, need)
        return total

    def available(self, sample: MemorySample, running: Mapping[str, int]) -> dict[str, int]:
        """Per device: free + what our children use now - what we account for them.

        ``running`` maps each model holding memory (loading, loaded; not sleeping) to
        its pid (0 when not started yet)."""
        tracked: dict[str, int] = {}
        for pid in running.values():
            _add(tracked, sample.usage.get(pid, {}))
        held = self.held(running)
        out = {}
        for dev in sample.devices:
            out[dev.name] = dev.free + tracked.get(dev.name, 0) - held.get(dev.name, 0)
        return out

    def deficit(
        self, model: str, sample: MemorySample, running: Mapping[str, int]
    ) -> dict[str, int] | None:
        """Bytes to free per device before ``model`` fits with the margin (empty when it
        fits); None when its need is unknown."""
        need = self.need(model)
        if need is None:
            return None
        available = self.available(sample, {m: p for m, p in running.items() if m != model})
        short = {}
        for dev, n in need.items():
            if n <= 0:
                continue
            missing = n + self.margin - available.get(dev, 0)
            if missing > 0:
                short[dev] = missing
        return short
