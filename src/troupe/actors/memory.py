"""Reading memory for the ledger: devices and what each child process holds.

Blocking reads (psutil, NVML) run in a worker thread. On the host, "free" is
MemAvailable, which already counts clean page cache, including the weight pages a
child maps from its GGUF file; so a child's usage beyond "free" is its anonymous
memory (RSS minus shared), while its footprint is its whole RSS.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import psutil
import trio

from troupe.catalog.memory import HOST
from troupe.hardware.devices import DeviceReader
from troupe.hardware.nvml import GpuDevice
from troupe.sched.memory import DeviceMemory, MemorySample

__all__ = ["MemorySampler", "ObservedStore", "gpu_name"]

log = logging.getLogger(__name__)


def gpu_name(index: int) -> str:
    return f"cuda:{index}"


class MemorySampler:
    def __init__(self, reader: DeviceReader) -> None:
        self._reader = reader

    @property
    def quick(self) -> bool:
        """Host memory only: a reading is a few ``/proc`` reads (about 80 us here), less
        than a worker thread's round trip (about 1 ms while children start and exit)."""
        return self._reader.host_only

    def sample(self, pids: Iterable[int]) -> MemorySample:
        pids = list(pids)
        devices = self._reader.read()
        out = [DeviceMemory(HOST, devices.host.total, devices.host.available)]
        out += [DeviceMemory(gpu_name(g.index), g.total, g.free) for g in devices.gpus]
        usage: dict[int, dict[str, int]] = {}
        footprint: dict[int, dict[str, int]] = {}
        for pid in pids:
            try:
                info = psutil.Process(pid).memory_info()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            usage[pid] = {HOST: max(0, info.rss - getattr(info, "shared", 0))}
            footprint[pid] = {HOST: info.rss}
            for index, used in devices.gpu_used_by(pid).items():
                if used:
                    usage[pid][gpu_name(index)] = used
                    footprint[pid][gpu_name(index)] = used
        blind = frozenset(gpu_name(g.index) for g in devices.gpus if _pids_hidden(g, pids))
        return MemorySample(tuple(out), usage, footprint, blind)

    async def asample(self, pids: Iterable[int]) -> MemorySample:
        pid_list = list(pids)
        return await trio.to_thread.run_sync(self.sample, pid_list)

    def close(self) -> None:
        self._reader.close()


def _pids_hidden(gpu: GpuDevice, ours: list[int]) -> bool:
    """NVML cannot say what troupe's children hold on ``gpu``: it lists no processes, or
    only PIDs this process cannot see (a container, where NVML speaks the host's PIDs)."""
    if gpu.processes is None:
        return True
    if not gpu.processes or any(p.pid in ours for p in gpu.processes):
        return False
    return not any(psutil.pid_exists(p.pid) for p in gpu.processes)


class ObservedStore:
    """What each model was seen to hold, by model and command line, kept across runs so
    the next estimate starts from an observation."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._data: dict[str, dict[str, object]] = {}
        with contextlib.suppress(OSError, ValueError):
            loaded = json.loads(path.read_text())
            if isinstance(loaded, dict):
                self._data = loaded

    def get(self, model: str, fingerprint: str) -> dict[str, int] | None:
        entry = self._data.get(model)
        if not isinstance(entry, dict) or entry.get("fingerprint") != fingerprint:
            return None
        used = entry.get("bytes")
        if isinstance(used, dict) and all(isinstance(v, int) for v in used.values()):
            return {str(k): int(v) for k, v in used.items()}
        return None

    def put(self, model: str, fingerprint: str, used: Mapping[str, int]) -> None:
        if self._data.get(model) == {"fingerprint": fingerprint, "bytes": dict(used)}:
            return
        self._data[model] = {"fingerprint": fingerprint, "bytes": dict(used)}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(self._data, indent=1, sort_keys=True))
            tmp.replace(self.path)
        except OSError as exc:
            log.warning("cannot save memory observations to %s: %s", self.path, exc)
