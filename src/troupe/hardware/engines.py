"""Choosing the engine build for this machine (as Jan's ``backend.rs``).

Each build gets one category, Jan's names: the first of its GPU backends this
machine can drive (``cuda-cu12.0``, ``vulkan``...), else its CPU variant
(``common_cpus``, ``avx2``, ``x64``...). A GPU build on a machine whose GPU it
cannot use still runs on the CPU, so it competes as a CPU build rather than
being thrown out. A build is out only when it cannot run at all: missing
libraries, a CPU variant this CPU cannot execute, a ``--list-devices`` that fails.

Then Jan's priority list picks the first category with a usable build, and the
first such build in the configured order. Vulkan (and the GPU backends Jan does
not know: HIP, SYCL...) is demoted below every CPU build unless some GPU has at
least 6 GiB (``determineBestBackend``), because a small GPU, often an integrated
one sharing RAM, is slower than the CPU build.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from troupe.hardware.builds import Backend, EngineBuild
from troupe.hardware.host import machine_arch, read_cpu_features
from troupe.hardware.nvml import GpuReport

__all__ = [
    "CUDA_DRIVER_MINIMUMS",
    "ENOUGH_GPU_MEMORY",
    "BuildVerdict",
    "EngineChoice",
    "HostFacts",
    "choose_engine",
    "compare_versions",
    "cuda_category",
    "judge",
    "priority",
]

# Oldest NVIDIA driver for each CUDA runtime major (NVIDIA's CUDA compatibility table).
CUDA_DRIVER_MINIMUMS: Mapping[str, Mapping[int, str]] = {
    "linux": {11: "450.80.02", 12: "525.60.13", 13: "580"},
    "windows": {11: "452.39", 12: "527.41", 13: "580"},
}
ENOUGH_GPU_MEMORY = 6 * 1024**3  # Jan: any GPU with total >= 6 * 1024 MiB
GIB = 1024**3

_CUDA = ("cuda-cu13.0", "cuda-cu12.0", "cuda-cu11.7", "cuda")  # "cuda": runtime major unknown
_CPU = ("common_cpus", "avx512", "avx2", "avx", "noavx", "arm64", "x64")
_OTHER_GPU = ("vulkan", "gpu")  # "gpu": HIP, SYCL, MUSA, ... (not in Jan's lists)
_CPU_NEEDS = {"avx512": "avx512f", "avx2": "avx2", "avx": "avx"}
# --list-devices id prefixes of each backend (lower case)
_DEVICE_PREFIXES = {
    Backend.CUDA: ("cuda",),
    Backend.VULKAN: ("vulkan",),
    Backend.HIP: ("rocm", "hip"),
    Backend.SYCL: ("sycl",),
    Backend.MUSA: ("musa",),
    Backend.OPENCL: ("gpuopencl", "opencl"),
    Backend.CANN: ("cann",),
    Backend.METAL: ("metal", "mtl"),
}


def priority(enough_gpu_memory: bool) -> tuple[str, ...]:
    """Jan's ``prioritize_backends`` order, best first."""
    if enough_gpu_memory:
        return _CUDA + _OTHER_GPU + _CPU
    return _CUDA + _CPU + _OTHER_GPU


def compare_versions(a: str, b: str) -> int:
    """Jan's ``compare_versions``: dot parts as integers (unparseable: 0), padded with 0."""

    def parts(v: str) -> list[int]:
        return [int(p) if p.isdigit() else 0 for p in v.strip().split(".")]

    pa, pb = parts(a), parts(b)
    n = max(len(pa), len(pb))
    pa += [0] * (n - len(pa))
    pb += [0] * (n - len(pb))
    return (pa > pb) - (pa < pb)


def cuda_category(major: int | None) -> str:
    return {13: "cuda-cu13.0", 12: "cuda-cu12.0", 11: "cuda-cu11.7"}.get(major or 0, "cuda")


@attrs.frozen
class HostFacts:
    """What the choice needs to know about this machine; `detect` fills it in."""

    os: str = "linux"  # "linux" | "windows" | "macos"
    arch: str = "x86_64"
    cpu_features: frozenset[str] = frozenset()
    gpus: GpuReport = attrs.field(factory=GpuReport)  # NVIDIA, through NVML
    render_node: bool = False  # /dev/dri/renderD*: a GPU some non-CUDA backend may drive

    @classmethod
    def detect(cls, gpus: GpuReport, dri: Path = Path("/dev/dri")) -> HostFacts:
        os_name = {"nt": "windows"}.get(os.name, "linux")
        try:
            render = any(p.name.startswith("renderD") for p in dri.iterdir())
        except OSError:
            render = False
        return cls(os_name, machine_arch(), read_cpu_features(), gpus, render)


@attrs.frozen
class BuildVerdict:
    """A build and how it fares here: its category, or None when it cannot run."""

    build: EngineBuild
    category: str | None
    reason: str
    fallback: bool = False  # a GPU build running on the CPU because its GPU backend cannot


@attrs.frozen
class EngineChoice:
    chosen: BuildVerdict | None
    reason: str  # why this build, in words
    verdicts: tuple[BuildVerdict, ...]  # every build, in the configured order
    enough_gpu_memory: bool

    @property
    def build(self) -> EngineBuild | None:
        return None if self.chosen is None else self.chosen.build


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def _listed(build: EngineBuild, backend: Backend) -> int | None:
    """How many devices of `backend` the build listed; None when it was not asked."""
    if build.devices is None:
        return None
    prefixes = _DEVICE_PREFIXES[backend]
    return sum(1 for d in build.devices if d.backend.lower().startswith(prefixes))


def _cuda_check(build: EngineBuild, host: HostFacts) -> str | None:
    """None when this build's CUDA backend can run here, else why not."""
    listed = _listed(build, Backend.CUDA)
    report = host.gpus
    if not report.gpus and not listed:
        why = report.absent_reason or "NVML sees no GPU"
        return f"no NVIDIA GPU ({why})"
    minimums = CUDA_DRIVER_MINIMUMS.get(host.os, CUDA_DRIVER_MINIMUMS["linux"])
    need = minimums.get(build.cuda_major or 0, minimums[11])
    driver = report.driver_version
    if driver is not None and compare_versions(driver, need) < 0:
        cuda = f"CUDA {build.cuda_major}" if build.cuda_major else "CUDA"
        return f"{cuda} needs NVIDIA driver >= {need}, this one is {driver}"
    if listed == 0:
        return "its --list-devices shows no CUDA device (CUDA runtime unreachable)"
    return None


def _cuda_ok(build: EngineBuild, host: HostFacts) -> str:
    cuda = f"CUDA {build.cuda_major}" if build.cuda_major else "CUDA (runtime version unknown)"
    driver = host.gpus.driver_version
    if driver is None:
        return f"{cuda}: the build lists {_listed(build, Backend.CUDA)} CUDA device(s)"
    minimums = CUDA_DRIVER_MINIMUMS.get(host.os, CUDA_DRIVER_MINIMUMS["linux"])
    need = minimums.get(build.cuda_major or 0, minimums[11])
    return f"{cuda}: NVIDIA driver {driver} >= {need}"


def _gpu_check(build: EngineBuild, backend: Backend, host: HostFacts) -> str | None:
    listed = _listed(build, backend)
    if listed is not None:
        return None if listed else f"its --list-devices shows no {backend.value} device"
    if host.gpus.gpus or host.render_node:
        return None
    return f"no GPU for {backend.value} (no NVIDIA GPU, no /dev/dri render node)"


def _cpu_check(build: EngineBuild, host: HostFacts) -> str | None:
    variant = build.cpu_variant
    if variant == "arm64" and host.arch != "aarch64":
        return f"an arm64 build cannot run on {host.arch}"
    if variant in ("x64", *_CPU_NEEDS) and host.arch not in ("x86_64", "i686", "x86"):
        return f"an x86-64 build cannot run on {host.arch}"
    flag = _CPU_NEEDS.get(variant)
    if flag and host.cpu_features and flag not in host.cpu_features:
        return f"built for {variant.upper()}, which this CPU lacks"
    return None


def judge(build: EngineBuild, host: HostFacts) -> BuildVerdict:
    """The category `build` competes in here, or why it cannot run."""
    if build.problem is not None:
        return BuildVerdict(build, None, build.problem)
    if build.devices_error is not None:
        return BuildVerdict(build, None, f"--list-devices failed: {build.devices_error}")
    cpu_problem = _cpu_check(build, host)
    if cpu_problem is not None:
        return BuildVerdict(build, None, cpu_problem)
    passed_over: list[str] = []
    if Backend.CUDA in build.backends:
        why = _cuda_check(build, host)
        if why is None:
            return BuildVerdict(build, cuda_category(build.cuda_major), _cuda_ok(build, host))
        passed_over.append(f"CUDA unusable: {why}")
    for backend in sorted(build.backends - {Backend.CUDA}):
        why = _gpu_check(build, backend, host)
        if why is None:
            category = "vulkan" if backend is Backend.VULKAN else "gpu"
            return BuildVerdict(build, category, f"{backend.value} backend has a device")
        passed_over.append(f"{backend.value} unusable: {why}")
    for lib, missing in build.skipped_backends.items():
        passed_over.append(f"{lib} will not load ({', '.join(missing)})")
    cpu = f"runs on the CPU ({build.cpu_variant})"
    return BuildVerdict(build, build.cpu_variant, "; ".join([*passed_over, cpu]), bool(passed_over))


def _largest_gpu(host: HostFacts, builds: Sequence[EngineBuild]) -> int:
    sizes = [g.total for g in host.gpus.gpus]
    sizes += [d.total_bytes for b in builds for d in (b.devices or ())]
    return max(sizes, default=0)


def choose_engine(builds: Sequence[EngineBuild], host: HostFacts) -> EngineChoice:
    """The best build for `host`, per Jan's priority, with the reasons in words."""
    largest = _largest_gpu(host, builds)
    enough = largest >= ENOUGH_GPU_MEMORY
    order = priority(enough)
    verdicts = tuple(judge(b, host) for b in builds)
    usable = [v for v in verdicts if v.category is not None]
    if not usable:
        why = "no engine build can run here" if verdicts else "no engine build configured"
        return EngineChoice(None, why, verdicts, enough)
    rank = {c: i for i, c in enumerate(order)}
    # Within a category the configured order decides, except that a GPU build reduced to
    # its CPU part yields to a build that is what it claims (fewer libraries, no GPU warnings).
    best = min(
        usable,
        key=lambda v: (rank.get(v.category or "", len(order)), v.fallback, verdicts.index(v)),
    )
    parts = [f"{best.build.label}: {best.reason}"]
    if len(usable) == 1:
        parts.append("the only usable build")
    else:
        below = sorted(
            {v.category for v in usable if v.category and v.category != best.category},
            key=lambda c: rank.get(c, len(order)),
        )
        if below:
            parts.append(f"{best.category} ranks above {', '.join(below)}")
        if sum(v.category == best.category for v in usable) > 1:
            parts.append(f"preferred among the {best.category} builds (configured order)")
    if any(v.category in _OTHER_GPU for v in usable):
        size = f"the largest GPU has {_gib(largest)}" if largest else "no GPU memory is known"
        place = "above" if enough else "below"
        parts.append(f"{size}: Vulkan and other non-CUDA GPU builds rank {place} CPU builds")
    return EngineChoice(best, "; ".join(parts), verdicts, enough)
