"""A child's CPU placement as engine flags, and what a command line already says.

``--threads``/``--threads-batch`` and a CPU set (``--cpu-range`` when the lane's CPUs
are consecutive, else ``--cpu-mask``) with ``--cpu-strict 1`` (one thread per CPU of
the lane); ``--poll 0`` on a shared lane, so a child waiting for work does not spin
on a core another child computes on. A flag the command line (or a preset) sets
itself is never added: the child keeps the user's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from troupe.sched.cpu import CpuPlan, CpuRequest

__all__ = ["PLACEMENT_FLAGS", "cpu_flags", "cpu_request", "parse_cpu_mask", "parse_cpu_range"]

# Flags that place a child's threads: with any of them, troupe leaves its CPUs alone.
PLACEMENT_FLAGS = ("--threads", "--threads-batch", "--cpu-range", "--cpu-mask", "--cpu-strict")


def parse_cpu_range(text: str) -> tuple[int, ...]:
    """llama.cpp's ``lo-hi`` (inclusive)."""
    lo, _, hi = text.strip().partition("-")
    return tuple(range(int(lo), int(hi or lo) + 1))


def parse_cpu_mask(text: str) -> tuple[int, ...]:
    """llama.cpp's hex mask (``0x`` optional): bit i is CPU i."""
    value = int(text.strip().lower().removeprefix("0x") or "0", 16)
    return tuple(i for i in range(value.bit_length()) if value >> i & 1)


def cpu_request(get: Callable[[str], str | None]) -> CpuRequest | None:
    """What the flags read through ``get`` (a spelling's value, or None) say about CPU
    placement; None when they say nothing (troupe places the child). Values the engine
    would reject stay the engine's to reject: they count as "all cores"."""
    if all(get(flag) is None for flag in PLACEMENT_FLAGS):
        return None
    threads: int | None = None
    cpus: tuple[int, ...] | None = None
    try:
        if (t := get("--threads")) is not None and int(t) > 0:
            threads = int(t)
        if (r := get("--cpu-range")) is not None:
            cpus = parse_cpu_range(r)
        elif (mask := get("--cpu-mask")) is not None:
            cpus = parse_cpu_mask(mask) or None
    except ValueError:
        pass
    return CpuRequest(threads=threads, cpus=cpus)


def cpu_flags(plan: CpuPlan, has: Callable[[str], bool]) -> list[str]:
    """The flags that put a child on ``plan``, less those the command line has."""
    cpus = plan.cpus
    consecutive = list(cpus) == list(range(cpus[0], cpus[0] + len(cpus)))
    placement: Sequence[tuple[str, str]] = (
        ("--threads", str(plan.threads)),
        ("--threads-batch", str(plan.threads)),
        (
            ("--cpu-range", f"{cpus[0]}-{cpus[-1]}")
            if consecutive
            else ("--cpu-mask", format(sum(1 << c for c in cpus), "x"))
        ),
        ("--cpu-strict", "1"),
    )
    out: list[str] = []
    for flag, value in placement:
        if not has(flag):
            out += [flag, value]
    if plan.shared and not has("--poll"):
        out += ["--poll", "0"]
    return out
