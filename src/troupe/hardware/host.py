"""The host: RAM and per-process RSS through psutil, CPU features from ``/proc/cpuinfo``."""

from __future__ import annotations

import logging
import platform
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

import attrs
import psutil

__all__ = [
    "CPU_FEATURE_PREFIXES",
    "HostMemory",
    "VirtualMemoryInfo",
    "cpu_features",
    "machine_arch",
    "process_rss",
    "read_cpu_features",
    "read_host_memory",
]

log = logging.getLogger(__name__)

# The instruction-set flags that decide which CPU build of llama.cpp can run here.
CPU_FEATURE_PREFIXES = (
    "avx",
    "amx",
    "f16c",
    "fma",
    "sse4",
    "ssse3",
    "neon",
    "asimd",
    "sve",
    "i8mm",
)


class VirtualMemoryInfo(Protocol):
    """What troupe reads of ``psutil.virtual_memory()``."""

    @property
    def total(self) -> int: ...
    @property
    def available(self) -> int: ...


@attrs.frozen
class HostMemory:
    """Host RAM in bytes. `available` (not ``free``) is what a new process can get
    without swapping: it counts reclaimable page cache."""

    total: int
    available: int


def read_host_memory(
    virtual_memory: Callable[[], VirtualMemoryInfo] = psutil.virtual_memory,
) -> HostMemory:
    vm = virtual_memory()
    return HostMemory(total=int(vm.total), available=int(vm.available))


def process_rss(pid: int, create_time: float | None = None) -> int | None:
    """Resident bytes of `pid`, or None when it is gone or hidden from us.

    With `create_time` (``psutil.Process.create_time()`` taken at spawn) a PID
    that was reused by another process reads as gone rather than as its stranger's RSS.
    """
    try:
        proc = psutil.Process(pid)
        if create_time is not None and abs(proc.create_time() - create_time) > 0.01:
            return None
        return int(proc.memory_info().rss)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess) as exc:
        log.debug("no RSS for pid %d: %s", pid, exc)
        return None


def cpu_features(cpuinfo: str) -> frozenset[str]:
    """The relevant instruction-set flags of the first CPU in a ``/proc/cpuinfo`` text.

    x86 lists them on ``flags``, ARM on ``Features``; every core lists the same, so
    the first line is enough.
    """
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("flags", "Features"):
            return frozenset(_relevant(value.split()))
    return frozenset()


def _relevant(flags: Iterable[str]) -> Iterable[str]:
    return (f for f in flags if f.startswith(CPU_FEATURE_PREFIXES))


def read_cpu_features(path: str | Path = "/proc/cpuinfo") -> frozenset[str]:
    """`cpu_features` of this machine; empty where there is no ``/proc/cpuinfo``."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError as exc:
        log.debug("cannot read %s: %s", path, exc)
        return frozenset()
    return cpu_features(text)


def machine_arch(machine: str | None = None) -> str:
    """``x86_64`` or ``aarch64`` (the names Jan's backend table uses), else as reported."""
    m = (machine if machine is not None else platform.machine()).lower()
    return {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64"}.get(m, m)
