"""A child's GPU placement as engine flags, and what a command line already says.

One GPU: ``--device CUDA1``. Several: ``--device CUDA0,CUDA2 --tensor-split 40000,20000``
(the proportions follow ``--device``'s order: each card's room in MiB). Part of the
model only: ``--n-gpu-layers N`` besides. None at all: ``--device none``. The engine
loads nothing on a device its ``--device`` list leaves out, so a child placed on one
card makes no context on the others.

A command line (or a preset) that sets ``--device``, ``--split-mode``, ``--main-gpu``
or ``--tensor-split`` itself places its child: troupe adds no device flag, and counts
it on the devices those name (`gpu_request`). ``--n-gpu-layers`` set by the user is
kept: troupe still chooses the cards, and never adds its own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from troupe.sched.devices import GpuPlan, GpuRequest

__all__ = ["DEVICE_FLAGS", "gpu_flags", "gpu_request"]

# Flags that place a child on GPUs: with any of them, troupe leaves its GPUs alone.
DEVICE_FLAGS = ("--device", "--split-mode", "--main-gpu", "--tensor-split")


def gpu_request(get: Callable[[str], str | None], names: Mapping[str, str]) -> GpuRequest | None:
    """What the flags read through ``get`` say about GPU placement, in troupe's device
    names (``names``: the engine's id -> troupe's, ``CUDA0`` -> ``cuda:0``); None when
    they say nothing (troupe places the child). What cannot be told (a device troupe
    does not know, a split it cannot read) counts as every GPU."""
    if all(get(flag) is None for flag in DEVICE_FLAGS):
        return None
    ordered = list(names.values())
    devices: list[str] | None = None
    listed = get("--device")
    if listed is not None:
        words = [w.strip() for w in listed.split(",") if w.strip()]
        if [w.lower() for w in words] == ["none"]:
            return GpuRequest(())
        known = [names[w] for w in words if w in names]
        if len(known) != len(words):
            return GpuRequest(None)
        devices = known
    pool = devices if devices is not None else ordered
    mode = (get("--split-mode") or "layer").strip().lower()
    if mode == "none":
        try:
            main = int(get("--main-gpu") or "0")
        except ValueError:
            return GpuRequest(None)
        return GpuRequest((pool[main],) if 0 <= main < len(pool) else None)
    split = get("--tensor-split")
    if split is not None:
        try:
            shares = [float(w) for w in split.replace("/", ",").split(",") if w.strip()]
        except ValueError:
            return GpuRequest(None)
        chosen = tuple(pool[i] for i, s in enumerate(shares) if s > 0 and i < len(pool))
        return GpuRequest(chosen or None)
    return GpuRequest(tuple(devices) if devices is not None else None)


def gpu_flags(plan: GpuPlan, ids: Mapping[str, str], has: Callable[[str], bool]) -> list[str]:
    """The flags that put a child on ``plan`` (``ids``: troupe's device name -> the
    engine's); ``--n-gpu-layers`` only where the command line has none. None for a
    child its own flags place."""
    if plan.fixed:
        return []
    if not plan.devices:
        return ["--device", "none"]
    out = ["--device", ",".join(ids[d] for d in plan.devices)]
    if len(plan.devices) > 1:
        out += ["--split-mode", "layer", "--tensor-split", ",".join(str(s) for s in plan.split)]
    if plan.layers is not None and not has("--n-gpu-layers"):
        out += ["--n-gpu-layers", str(plan.layers)]
    return out
