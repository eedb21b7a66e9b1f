"""The device ledger (pure): which GPUs each child troupe placed runs on.

llama-server splits a model's layers over every GPU it sees by default, so on a box
with several cards two models that would each fit one card both spread over all of
them. With ``--gpu-placement auto`` each child gets the GPUs it needs and no more,
chosen on the memory reading admission uses (`troupe.sched.memory`), after the margin:

* a model whose GPU part fits on one card gets one: a card none of troupe's other
  children use if one holds it, the one with the most room among those;
* one that needs several gets the fewest that hold it (the roomiest first), its
  layers split over them by their room (``--tensor-split``);
* one that fits on no combination of the cards, even with none of troupe's models
  on them, is offloaded in part: ``--n-gpu-layers`` from its need and the room there
  is; the rest of it (and its threads) stays on the host;
* one that would fit once room is freed asks for an eviction on the card(s) it would
  go to (`Fit.short`: candidates in order), never anywhere else.

A model whose command line names its own devices (``--device``, ``--split-mode``,
``--main-gpu``, ``--tensor-split``) is left as given and counted on those devices.
A model whose need is unknown is not placed (the engine's default: every GPU).

Device names are troupe's (``"cuda:0"``, by NVML index; ``"host"``); the launcher
turns them into the engine's (``CUDA0``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

__all__ = ["HOST", "Fit", "GpuPlan", "GpuRequest", "gpu_part", "place", "spread"]

HOST = "host"
PerDevice = Mapping[str, int]
MIB = 1 << 20


@attrs.frozen
class GpuRequest:
    """What a child's own command line says about its GPUs: leave it as given.
    ``devices``: the GPUs it names (None: every GPU, the engine's default; empty: none)."""

    devices: tuple[str, ...] | None = None


@attrs.frozen
class GpuPlan:
    """Where one child runs: its GPUs (troupe's names, in the order the engine gets
    them), their shares of the layers (``--tensor-split``; empty for one GPU), how many
    layers go to them when not all fit (None: all), and what it is counted as holding
    on each device (the host included)."""

    devices: tuple[str, ...]
    split: tuple[int, ...] = ()
    layers: int | None = None
    need: Mapping[str, int] = attrs.field(factory=dict)
    fixed: bool = False  # placed by its own flags: troupe adds none, only counts it


@attrs.frozen
class Fit:
    """Where a model would go now. ``plan`` (None: not troupe's to place, or it does not
    fit); ``short``: the bytes to free per device for it to go on fewer cards, or at all,
    one mapping per place it could go, best first (empty: it fits as ``plan`` says; with
    a ``plan`` too, it fits there meanwhile, on more cards)."""

    plan: GpuPlan | None = None
    short: tuple[Mapping[str, int], ...] = ()
    meanwhile: bool = False  # with ``short``: ``plan`` fits now, on more cards


def gpu_part(need: PerDevice) -> tuple[int, int]:
    """(host bytes, GPU bytes) of a need, whatever GPUs it was seen or projected on."""
    host = sum(n for dev, n in need.items() if dev == HOST)
    return host, sum(n for dev, n in need.items() if dev != HOST and n > 0)


def spread(total: int, devices: tuple[str, ...], weights: tuple[int, ...]) -> dict[str, int]:
    """``total`` bytes over ``devices`` in proportion to ``weights`` (the last takes the
    rounding)."""
    out: dict[str, int] = {}
    whole = sum(weights) or len(devices)
    left = total
    for i, dev in enumerate(devices):
        share = left if i == len(devices) - 1 else total * (weights[i] or 1) // whole
        out[dev] = share
        left -= share
    return out


def _split_of(room: Mapping[str, int], chosen: tuple[str, ...]) -> tuple[int, ...]:
    """``--tensor-split`` proportions: each card's room in MiB (at least 1)."""
    return tuple(max(1, room[d] // MIB) for d in chosen)


def _plan(
    host: int, gpu: int, chosen: tuple[str, ...], room: Mapping[str, int], layers: int | None
) -> GpuPlan:
    if len(chosen) == 1:
        need = {chosen[0]: gpu}
        split: tuple[int, ...] = ()
    else:
        split = _split_of(room, chosen)
        need = spread(gpu, chosen, tuple(room[d] for d in chosen))
    if host:
        need[HOST] = host
    return GpuPlan(chosen, split, layers, need)


def place(
    need: PerDevice,
    available: Mapping[str, int],
    capacity: Mapping[str, int],
    gpus: Iterable[str],
    margin: int,
    layers: int | None,
    sharing: Mapping[str, int] | None = None,
) -> Fit:
    """Where a model needing ``need`` goes among ``gpus``.

    ``available``: per device, what is free for it now (`MemoryLedger.available`);
    ``capacity``: per GPU, what would be with none of troupe's other models on it;
    ``layers``: the model's layer count (for a partial offload; None: unknown);
    ``sharing``: per GPU, how many of troupe's other children are on it.
    The host part is checked by the caller, as for any model; a partial offload adds
    to it what does not go to the GPUs."""
    host, gpu = gpu_part(need)
    cards = [g for g in gpus if g in available]
    if not cards or gpu <= 0:
        return Fit()
    room = {g: available[g] - margin for g in cards}
    by_room = sorted(cards, key=lambda g: (-room[g], g))
    # One card: of those that hold it, one with none of troupe's other children on it
    # (two models on one card share its compute), the roomiest first.
    sharing = sharing or {}
    alone = [g for g in by_room if room[g] >= gpu + 1]
    if alone:
        best = min(alone, key=lambda g: (sharing.get(g, 0), -room[g], g))
        return Fit(_plan(host, gpu, (best,), room, None))
    # The fewest cards whose room now holds it: the roomiest first.
    now: GpuPlan | None = None
    total = 0
    for k, g in enumerate(by_room, start=1):
        total += max(0, room[g])
        if total >= gpu + k and room[g] > 0:  # (+ k: each share rounds up by a byte)
            now = _plan(host, gpu, tuple(sorted(by_room[:k])), room, None)
            break
    # Would it fit on fewer once troupe's other models gave their room up? Then that
    # room is asked for first (``plan``: where it fits meanwhile, if anywhere).
    ceiling = {g: capacity.get(g, available[g]) - margin for g in cards}
    by_ceiling = sorted(cards, key=lambda g: (-ceiling[g], g))
    total = 0
    for k, g in enumerate(by_ceiling, start=1):
        total += max(0, ceiling[g])
        if total >= gpu:
            if now is not None and len(now.devices) <= k:
                return Fit(now)
            shorts = tuple(_short(gpu, k, cards, room, ceiling))
            return Fit(now, shorts, meanwhile=now is not None)
    if now is not None:
        return Fit(now)
    # No combination holds it: as many layers as the room now holds, the rest on the host.
    usable = tuple(sorted(g for g in by_room if room[g] > 0))
    on_gpu = sum(room[g] for g in usable)
    if not usable or not layers:
        return Fit(GpuPlan((), (), 0, {HOST: host + gpu}))
    fit_layers = min(layers - 1, layers * on_gpu // gpu)  # one layer short: the safe side
    if fit_layers <= 0:
        return Fit(GpuPlan((), (), 0, {HOST: host + gpu}))
    placed = gpu * fit_layers // layers
    plan = _plan(host + gpu - placed, placed, usable, room, fit_layers)
    return Fit(plan)


def _short(
    gpu: int,
    k: int,
    cards: list[str],
    room: Mapping[str, int],
    ceiling: Mapping[str, int],
) -> list[dict[str, int]]:
    """What to free for a model needing ``gpu`` bytes on ``k`` cards: for one card, each
    card that could hold it (the least to free first); for several, the roomiest set
    that could."""
    if k == 1:
        fits = [g for g in cards if ceiling[g] >= gpu]
        fits.sort(key=lambda g: (gpu - room[g], g))
        return [{g: gpu - room[g]} for g in fits]
    chosen = sorted(cards, key=lambda g: (-ceiling[g], -room[g], g))[:k]
    missing = gpu - sum(max(0, room[g]) for g in chosen)
    weights = tuple(max(1, ceiling[g] - max(0, room[g])) for g in chosen)
    return [{d: n for d, n in spread(missing, tuple(chosen), weights).items() if n > 0}]
