"""A fake NVML with the shape of ``pynvml`` and builders for engine-choice tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import pynvml

from troupe.hardware import EngineBuild, GpuDevice, GpuReport, ListedDevice
from troupe.hardware.builds import Backend

GIB = 1024**3

# NVML error codes the fake raises (real pynvml exception classes, known messages)
NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
LIBRARY_NOT_FOUND = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
NO_PERMISSION = pynvml.NVML_ERROR_NO_PERMISSION
GPU_IS_LOST = pynvml.NVML_ERROR_GPU_IS_LOST
DRIVER_NOT_LOADED = pynvml.NVML_ERROR_DRIVER_NOT_LOADED


@attrs.define
class FakeGpu:
    name: str | bytes = "NVIDIA Fake 24G"
    uuid: str | bytes = "GPU-00000000-0000-0000-0000-000000000000"
    bus_id: bytes | str = b"00000000:01:00.0"
    total: int = 24 * GIB
    free: int = 20 * GIB
    used: int = 4 * GIB
    cc: tuple[int, int] = (8, 9)
    processes: list[tuple[int, int | None]] = attrs.Factory(list)


class FakeNvml:
    """Answers like ``pynvml`` for the GPUs given. ``fail`` maps a function name, or
    ``(name, gpu index)``, to the NVML error code that call raises."""

    NVMLError = pynvml.NVMLError

    def __init__(
        self,
        gpus: Sequence[FakeGpu] = (),
        *,
        fail: Mapping[str | tuple[str, int], int] | None = None,
        driver: str | bytes = "550.54.14",
        cuda: int = 12040,
    ) -> None:
        self.gpus = list(gpus)
        self.fail = dict(fail or {})
        self.driver = driver
        self.cuda = cuda
        self.calls: list[str] = []
        self.inits = 0
        self.shutdowns = 0

    def _check(self, name: str, index: int | None = None) -> None:
        self.calls.append(name)
        code = self.fail.get(name)
        if code is None and index is not None:
            code = self.fail.get((name, index))
        if code is not None:
            raise pynvml.NVMLError(code)

    def nvmlInit(self) -> None:
        self._check("nvmlInit")
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1
        self._check("nvmlShutdown")

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._check("nvmlDeviceGetHandleByIndex", index)
        return index

    def nvmlDeviceGetName(self, handle: int) -> str | bytes:
        self._check("nvmlDeviceGetName", handle)
        return self.gpus[handle].name

    def nvmlDeviceGetUUID(self, handle: int) -> str | bytes:
        self._check("nvmlDeviceGetUUID", handle)
        return self.gpus[handle].uuid

    def nvmlDeviceGetPciInfo(self, handle: int) -> Any:
        self._check("nvmlDeviceGetPciInfo", handle)
        return SimpleNamespace(busId=self.gpus[handle].bus_id)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        self._check("nvmlDeviceGetMemoryInfo", handle)
        g = self.gpus[handle]
        return SimpleNamespace(total=g.total, free=g.free, used=g.used)

    def nvmlDeviceGetCudaComputeCapability(self, handle: int) -> tuple[int, int]:
        self._check("nvmlDeviceGetCudaComputeCapability", handle)
        return self.gpus[handle].cc

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        self._check("nvmlDeviceGetComputeRunningProcesses", handle)
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=None)
            for pid, used in self.gpus[handle].processes
        ]

    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        self._check("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        self._check("nvmlSystemGetCudaDriverVersion")
        return self.cuda


def gpu_report(*totals_gib: float, driver: str | None = "550.54.14") -> GpuReport:
    """An NVML report with GPUs of the given sizes (no GPUs: NVML absent)."""
    gpus = tuple(
        GpuDevice(i, f"GPU{i}", None, None, int(t * GIB), int(t * GIB), 0, (8, 9), ())
        for i, t in enumerate(totals_gib)
    )
    if not gpus:
        return GpuReport(absent_reason="NVML: NVML Shared Library Not Found")
    return GpuReport(gpus, driver, 12040 if driver else None)


def build(
    label: str,
    *backends: Backend,
    cuda: int | None = None,
    cpu: str = "x64",
    missing: Sequence[str] = (),
    devices: Sequence[tuple[str, int]] | None = None,
    devices_error: str | None = None,
    skipped: Mapping[str, tuple[str, ...]] | None = None,
) -> EngineBuild:
    """An inspected build; `devices` are (id, total MiB) as --list-devices printed them."""
    return EngineBuild(
        path=Path(f"/opt/{label}/llama-server"),
        label=label,
        backends=frozenset(backends),
        cuda_major=cuda,
        cpu_variant=cpu,
        missing=tuple(missing),
        skipped_backends=dict(skipped or {}),
        problem=f"missing shared libraries: {', '.join(missing)}" if missing else None,
        devices=None
        if devices is None
        else tuple(ListedDevice(i, f"dev {i}", mib, mib) for i, mib in devices),
        devices_error=devices_error,
    )
