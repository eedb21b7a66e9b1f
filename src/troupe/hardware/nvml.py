"""NVIDIA GPUs through NVML (``nvidia-ml-py``, imported as ``pynvml``), behind a small boundary.

`NvmlApi` names the few ``pynvml`` functions troupe calls, spelled as ``pynvml``
spells them, so the module itself satisfies it and a test can pass a fake with
the same shape (0, 1 or 2 GPUs, failing calls, per-process memory of None).

No NVML library, no driver, or no GPU all mean the same thing to troupe: there
are no GPUs. That is logged at debug level and kept as a one-line reason for
``troupe doctor``, never raised. A call that fails for one GPU drops what that
call would have told (compute capability, processes) but keeps the GPU; only a
GPU whose handle or memory cannot be read is left out, because a device with
unknown memory is useless to the memory ledger.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import attrs

__all__ = [
    "GpuDevice",
    "GpuProcess",
    "GpuReport",
    "NvmlApi",
    "NvmlSession",
    "load_nvml",
    "read_gpus",
]

log = logging.getLogger(__name__)
T = TypeVar("T")


class NvmlApi(Protocol):
    """The subset of ``pynvml`` troupe uses (the module satisfies it as is)."""

    NVMLError: type[Exception]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any: ...  # .busId: bytes or str
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...  # .total .free .used, bytes
    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> Sequence[Any]: ...
    def nvmlSystemGetDriverVersion(self) -> str | bytes: ...
    def nvmlSystemGetCudaDriverVersion(self) -> int: ...


@attrs.frozen
class GpuProcess:
    """A compute process on a GPU; `used_bytes` is None where NVML cannot tell (WDDM)."""

    pid: int
    used_bytes: int | None


@attrs.frozen
class GpuDevice:
    """One NVIDIA GPU. `index` is NVML's (PCI bus order), not necessarily CUDA's:
    match llama.cpp's ``CUDA<n>`` by `uuid` or `pci_bus_id`."""

    index: int
    name: str
    uuid: str | None
    pci_bus_id: str | None
    total: int  # bytes
    free: int
    used: int
    compute_capability: tuple[int, int] | None
    processes: tuple[GpuProcess, ...] | None  # None: NVML could not list them

    def used_by(self, pid: int) -> int | None:
        """Bytes `pid` holds on this GPU: 0 when it has no context here, None when unknown."""
        if self.processes is None:
            return None
        for p in self.processes:
            if p.pid == pid:
                return p.used_bytes
        return 0


@attrs.frozen
class GpuReport:
    """Every GPU NVML sees, the driver, and why there are none when there are none."""

    gpus: tuple[GpuDevice, ...] = ()
    driver_version: str | None = None  # e.g. "580.65.06"
    cuda_driver_version: int | None = None  # e.g. 12040 for CUDA 12.4
    absent_reason: str | None = None  # set when NVML gave nothing: "NVML Shared Library Not Found"

    @property
    def cuda_version(self) -> tuple[int, int] | None:
        """(major, minor) of the newest CUDA the driver supports."""
        v = self.cuda_driver_version
        return None if v is None else (v // 1000, (v % 1000) // 10)


def load_nvml() -> NvmlApi | None:
    """The ``pynvml`` module, or None when the bindings are not installed."""
    try:
        import pynvml  # noqa: PLC0415  (optional at run time; absent means no GPUs)
    except ImportError:
        log.debug("nvidia-ml-py is not installed: no NVIDIA GPUs")
        return None
    api: NvmlApi = pynvml
    return api


def _text(value: str | bytes) -> str:
    # nvidia-ml-py returns str from most getters but bytes from ctypes struct fields
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class NvmlSession:
    """NVML initialised once and read many times (``nvmlInit`` can take a second on a
    large host). `open` never raises: a session that failed to start reads as no GPUs."""

    def __init__(self, api: NvmlApi | None, error: str | None) -> None:
        self._api = api
        self._error = error

    @classmethod
    def open(cls, api: NvmlApi | None) -> NvmlSession:
        if api is None:
            return cls(None, "nvidia-ml-py is not installed")
        try:
            api.nvmlInit()
        except api.NVMLError as exc:
            log.debug("NVML unavailable: %s", exc)
            return cls(None, f"NVML: {exc}")
        return cls(api, None)

    @property
    def active(self) -> bool:
        return self._api is not None

    def close(self) -> None:
        api, self._api = self._api, None
        if api is None:
            return
        try:
            api.nvmlShutdown()
        except api.NVMLError as exc:  # nothing to do about it; the process may be exiting
            log.debug("nvmlShutdown failed: %s", exc)
        self._error = "NVML session closed"

    def __enter__(self) -> NvmlSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read(self) -> GpuReport:
        """The GPUs as they are now (blocking: call from a worker thread in async code)."""
        api = self._api
        if api is None:
            return GpuReport(absent_reason=self._error)
        try:
            count = api.nvmlDeviceGetCount()
        except api.NVMLError as exc:
            log.debug("nvmlDeviceGetCount failed: %s", exc)
            return GpuReport(absent_reason=f"NVML: cannot count devices: {exc}")
        gpus = tuple(g for g in (_read_gpu(api, i) for i in range(count)) if g is not None)
        driver = _optional(api, "driver version", lambda: _text(api.nvmlSystemGetDriverVersion()))
        cuda = _optional(api, "CUDA driver version", api.nvmlSystemGetCudaDriverVersion)
        reason = None if gpus else ("NVML sees no GPU" if count == 0 else "no GPU could be read")
        return GpuReport(gpus, driver, cuda, reason)


def _optional(api: NvmlApi, what: str, call: Callable[[], T]) -> T | None:
    """`call()`, or None when NVML refuses (old driver, not supported, no permission)."""
    try:
        return call()
    except api.NVMLError as exc:
        log.debug("NVML %s: %s", what, exc)
        return None


def _processes(api: NvmlApi, handle: Any) -> tuple[GpuProcess, ...] | None:
    procs = _optional(api, "processes", lambda: api.nvmlDeviceGetComputeRunningProcesses(handle))
    if procs is None:
        return None
    out = []
    for p in procs:
        used = getattr(p, "usedGpuMemory", None)
        out.append(GpuProcess(int(p.pid), None if used is None else int(used)))
    return tuple(out)


def _read_gpu(api: NvmlApi, index: int) -> GpuDevice | None:
    try:
        handle = api.nvmlDeviceGetHandleByIndex(index)
        mem = api.nvmlDeviceGetMemoryInfo(handle)
    except api.NVMLError as exc:
        log.debug("GPU %d left out: %s", index, exc)
        return None
    name = _optional(api, "name", lambda: _text(api.nvmlDeviceGetName(handle)))
    uuid = _optional(api, "uuid", lambda: _text(api.nvmlDeviceGetUUID(handle)))
    pci = _optional(api, "PCI info", lambda: _text(api.nvmlDeviceGetPciInfo(handle).busId))
    cc = _optional(
        api, "compute capability", lambda: api.nvmlDeviceGetCudaComputeCapability(handle)
    )
    return GpuDevice(
        index=index,
        name=name or f"GPU {index}",
        uuid=uuid,
        pci_bus_id=pci,
        total=int(mem.total),
        free=int(mem.free),
        used=int(mem.used),
        compute_capability=None if cc is None else (int(cc[0]), int(cc[1])),
        processes=_processes(api, handle),
    )


def read_gpus(api: NvmlApi | None) -> GpuReport:
    """One-shot: initialise NVML, read every GPU, shut NVML down."""
    with NvmlSession.open(api) as session:
        return session.read()
