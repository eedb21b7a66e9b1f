"""One device list: host RAM (always there) and the NVIDIA GPUs NVML sees (maybe none).

The sync functions block (NVML, psutil, ``/proc``); the ``a``-prefixed twins run
them in a Trio worker thread so an actor never stalls the event loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import attrs
import trio

from troupe.hardware.host import HostMemory, VirtualMemoryInfo, process_rss, read_host_memory
from troupe.hardware.nvml import (
    GpuDevice,
    GpuReport,
    NvmlApi,
    NvmlSession,
    load_nvml,
)

__all__ = [
    "DeviceList",
    "DeviceReader",
    "NvmlChoice",
    "aprocess_rss",
    "aread_devices",
    "read_devices",
]

# "auto": load pynvml; None: no NVML at all; anything else: an NvmlApi (a fake in tests)
NvmlChoice = NvmlApi | None | Literal["auto"]


@attrs.frozen
class DeviceList:
    """Host RAM plus every GPU, read at one moment."""

    host: HostMemory
    gpu_report: GpuReport = attrs.field(factory=lambda: GpuReport(absent_reason="not read"))

    @property
    def gpus(self) -> tuple[GpuDevice, ...]:
        return self.gpu_report.gpus

    @property
    def driver_version(self) -> str | None:
        return self.gpu_report.driver_version

    @property
    def cuda_version(self) -> tuple[int, int] | None:
        return self.gpu_report.cuda_version

    def gpu_used_by(self, pid: int) -> dict[int, int | None]:
        """Bytes `pid` holds on each GPU where it holds any (None: NVML could not say)."""
        out: dict[int, int | None] = {}
        for gpu in self.gpus:
            used = gpu.used_by(pid)
            if used != 0:
                out[gpu.index] = used
        return out


def _resolve(nvml: NvmlChoice) -> NvmlApi | None:
    return load_nvml() if isinstance(nvml, str) else nvml


class DeviceReader:
    """Reads the device list again and again with one NVML session.

    ``nvml`` defaults to the real ``pynvml``; pass None for "no NVML", or a fake;
    ``virtual_memory`` defaults to ``psutil.virtual_memory``.
    Use it as a (sync) context manager or call `close`; both are idempotent.
    """

    def __init__(
        self,
        nvml: NvmlChoice = "auto",
        virtual_memory: Callable[[], VirtualMemoryInfo] | None = None,
    ) -> None:
        self._session = NvmlSession.open(_resolve(nvml))
        self._virtual_memory = virtual_memory

    def read(self) -> DeviceList:
        host = (
            read_host_memory(self._virtual_memory)
            if self._virtual_memory is not None
            else read_host_memory()
        )
        return DeviceList(host=host, gpu_report=self._session.read())

    @property
    def host_only(self) -> bool:
        """No NVML session: a reading is two ``/proc`` files, never a driver call."""
        return not self._session.active

    async def aread(self) -> DeviceList:
        return await trio.to_thread.run_sync(self.read)

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> DeviceReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_devices(nvml: NvmlChoice = "auto") -> DeviceList:
    """One-shot device list (NVML started and stopped around the read)."""
    with DeviceReader(nvml) as reader:
        return reader.read()


async def aread_devices(nvml: NvmlChoice = "auto") -> DeviceList:
    """`read_devices` in a worker thread."""
    return await trio.to_thread.run_sync(read_devices, nvml)


async def aprocess_rss(pid: int, create_time: float | None = None) -> int | None:
    """`process_rss` in a worker thread."""
    return await trio.to_thread.run_sync(process_rss, pid, create_time)
