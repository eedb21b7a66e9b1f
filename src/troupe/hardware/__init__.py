"""The machine troupe runs on: devices and memory, engine builds, and what fits.

* `devices`: one device list, host RAM (psutil) plus NVIDIA GPUs (NVML behind
  the `NvmlApi` boundary); sync readers and ``a``-prefixed Trio twins.
* `builds`, `engines`, `listdevices`: what each configured ``llama-server``
  build is (``ldd``), which one suits this machine (Jan's priority), and the
  devices a build reports (``--list-devices``).
* `feasibility`, `estimate`: GREEN / YELLOW / RED from troupe's own estimate.

No GPU, no NVML library, no driver: GPUs are simply absent, never an error.
"""

from __future__ import annotations

from troupe.hardware.builds import Backend, EngineBuild, LddError, inspect_build, parse_ldd, run_ldd
from troupe.hardware.devices import (
    DeviceList,
    DeviceReader,
    NvmlChoice,
    aprocess_rss,
    aread_devices,
    read_devices,
)
from troupe.hardware.engines import (
    CUDA_DRIVER_MINIMUMS,
    ENOUGH_GPU_MEMORY,
    BuildVerdict,
    EngineChoice,
    HostFacts,
    choose_engine,
    compare_versions,
    judge,
    priority,
)
from troupe.hardware.estimate import DEFAULT_FIT_CTX, MemoryEstimate, context_for, estimate_memory
from troupe.hardware.feasibility import (
    RESERVE,
    Feasibility,
    FitReport,
    feasibility,
    format_bytes,
)
from troupe.hardware.host import (
    HostMemory,
    cpu_features,
    machine_arch,
    process_rss,
    read_cpu_features,
    read_host_memory,
)
from troupe.hardware.listdevices import (
    DeviceListError,
    ListedDevice,
    parse_list_devices,
    run_list_devices,
)
from troupe.hardware.nvml import (
    GpuDevice,
    GpuProcess,
    GpuReport,
    NvmlApi,
    NvmlSession,
    load_nvml,
    read_gpus,
)

__all__ = [
    "CUDA_DRIVER_MINIMUMS",
    "DEFAULT_FIT_CTX",
    "ENOUGH_GPU_MEMORY",
    "RESERVE",
    "Backend",
    "BuildVerdict",
    "DeviceList",
    "DeviceListError",
    "DeviceReader",
    "EngineBuild",
    "EngineChoice",
    "Feasibility",
    "FitReport",
    "GpuDevice",
    "GpuProcess",
    "GpuReport",
    "HostFacts",
    "HostMemory",
    "LddError",
    "ListedDevice",
    "MemoryEstimate",
    "NvmlApi",
    "NvmlChoice",
    "NvmlSession",
    "aprocess_rss",
    "aread_devices",
    "choose_engine",
    "compare_versions",
    "context_for",
    "cpu_features",
    "estimate_memory",
    "feasibility",
    "format_bytes",
    "inspect_build",
    "judge",
    "load_nvml",
    "machine_arch",
    "parse_ldd",
    "parse_list_devices",
    "priority",
    "process_rss",
    "read_cpu_features",
    "read_devices",
    "read_gpus",
    "read_host_memory",
    "run_ldd",
    "run_list_devices",
]
