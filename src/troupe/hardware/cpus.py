"""The machine's CPUs as troupe may use them: the process's allowed set, grouped into
physical cores (SMT siblings together) with their NUMA node, from sysfs.

A core whose topology cannot be read counts as a core of its own (a container with a
partial /sys still gets one lane per allowed CPU); an empty allowed set, or a read
that fails outright, gives None, and placement is off.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path

from troupe.sched.cpu import CpuCore, CpuTopology

__all__ = ["format_cpus", "parse_cpu_list", "read_topology"]

log = logging.getLogger("troupe.hardware")

SYS = Path("/sys/devices/system")


def parse_cpu_list(text: str) -> list[int]:
    """``0-3,8,10-11`` -> [0, 1, 2, 3, 8, 10, 11] (the kernel's cpulist format)."""
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def format_cpus(cpus: Iterable[int]) -> str:
    """The inverse: [0, 1, 2, 5] -> ``0-2,5``."""
    ids = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(ids):
        j = i
        while j + 1 < len(ids) and ids[j + 1] == ids[j] + 1:
            j += 1
        parts.append(str(ids[i]) if i == j else f"{ids[i]}-{ids[j]}")
        i = j + 1
    return ",".join(parts)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def read_topology(allowed: Iterable[int] | None = None, sys: Path = SYS) -> CpuTopology | None:
    try:
        cpus = sorted(allowed if allowed is not None else os.sched_getaffinity(0))
    except OSError as exc:
        log.warning("cannot read this process's CPU set (%s): CPU placement is off", exc)
        return None
    if not cpus:
        return None
    node_of: dict[int, int] = {}
    for node_dir in sorted((sys / "node").glob("node[0-9]*")):
        text = _read(node_dir / "cpulist")
        if text is not None:
            for cpu in parse_cpu_list(text):
                node_of[cpu] = int(node_dir.name[4:])
    cores: dict[tuple[int, int, int], list[int]] = {}
    for cpu in cpus:
        top = sys / "cpu" / f"cpu{cpu}" / "topology"
        package = _read(top / "physical_package_id")
        core = _read(top / "core_id")
        unknown = package is None or core is None  # then a core of its own
        key = (-1, -1, cpu) if unknown else (int(package or 0), int(core or 0), -1)
        cores.setdefault(key, []).append(cpu)
    groups = sorted((tuple(sorted(c)) for c in cores.values()), key=lambda c: c[0])
    return CpuTopology(tuple(CpuCore(g, node_of.get(g[0], 0)) for g in groups))
