"""Will a model fit? GREEN / YELLOW / RED, Jan's ``is_model_supported``.

The rule is Jan's; the input is not. Jan adds the file size, an f16-only KV
guess at the full context and a sibling ``mmproj.gguf``; troupe passes its own
estimate (tensor bytes + `troupe.gguf.kv_cache_bytes` at the context the model
would run with + the projector), so ``required`` is whatever the caller sums.

* GREEN: fits in (V)RAM alone after the reserve.
* YELLOW: fits only by spilling from the GPUs into host RAM (CPU/GPU hybrid).
* RED: does not fit at all.

Jan counts memory in whole MiB from its hardware plugin; troupe passes bytes,
which differs by less than 1 MiB per device.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import attrs

__all__ = [
    "APPLE_FIXED_RESERVE",
    "RESERVE",
    "Feasibility",
    "FitReport",
    "feasibility",
    "format_bytes",
]

RESERVE = 2_288_490_189  # bytes (~2.13 GiB) kept for driver and runtime overhead, per device pool
APPLE_FIXED_RESERVE = 2_684_354_560  # 2.5 GiB the OS keeps on unified-memory Macs


def format_bytes(n: int | None) -> str:
    """``1.5 GiB``; ``?`` for None."""
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024:
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


class Feasibility(enum.StrEnum):
    GREEN = "GREEN"
    YELLOW = "YELLOW"
    RED = "RED"


@attrs.frozen
class FitReport:
    colour: Feasibility
    required: int  # bytes the model needs
    usable_vram: int  # bytes it may take and still be GREEN
    usable_total: int  # bytes it may take and still be YELLOW

    def explain(self) -> str:
        """One line for a report: why this colour."""
        need, alone = format_bytes(self.required), format_bytes(self.usable_vram)
        if self.colour is Feasibility.GREEN:
            return f"{need} fits in the {alone} usable"
        if self.colour is Feasibility.YELLOW:
            return f"{need} exceeds the {alone} usable on GPUs: spills into host RAM"
        return f"{need} exceeds the {format_bytes(self.usable_total)} usable in all"


def _unified(required: int, total: int) -> FitReport:
    # Apple Silicon: one pool, 2.5 GiB fixed plus 10 % (Jan truncates the 10 % to bytes)
    usable = max(0, total - APPLE_FIXED_RESERVE - total // 10)
    if required > usable:
        colour = Feasibility.RED
    elif required * 100 <= usable * 85:  # integer form of required <= 0.85 * usable
        colour = Feasibility.GREEN
    else:
        colour = Feasibility.YELLOW
    return FitReport(colour, required, usable * 85 // 100, usable)


def feasibility(
    required: int,
    *,
    ram_total: int,
    gpu_totals: Sequence[int] = (),
    unified: bool = False,
) -> FitReport:
    """The colour of a model needing `required` bytes on a host with `ram_total` bytes
    of RAM and GPUs of `gpu_totals` bytes each.

    Without GPUs the RAM plays the GPU's part (``vram = RAM``, ``ram = 0``), so a
    CPU-only host answers GREEN or RED, never YELLOW. `unified` selects the
    Apple Silicon branch (unified memory, no discrete GPU).
    """
    if required < 0:
        raise ValueError(f"required bytes must be >= 0, got {required}")
    if unified:
        return _unified(required, ram_total)
    if gpu_totals:
        vram, ram = sum(gpu_totals), ram_total
    else:
        vram, ram = ram_total, 0
    usable_vram = max(0, vram - RESERVE)
    usable_total = (ram - RESERVE) + usable_vram if ram > RESERVE else usable_vram
    if required > usable_total:
        colour = Feasibility.RED
    elif required <= usable_vram:
        colour = Feasibility.GREEN
    else:
        colour = Feasibility.YELLOW
    return FitReport(colour, required, usable_vram, usable_total)
