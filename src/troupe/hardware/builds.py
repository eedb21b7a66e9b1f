"""What an engine build is: its GPU backends, CUDA runtime, CPU variant and missing libraries.

A build's backend is read from the shared libraries it loads, not from its name:
``ldd`` on the binary (transitively: ``libggml-cuda.so`` linked in shows its
``libcudart.so.12``), plus the ``libggml-<backend>.so`` files beside the binary
that a ``GGML_BACKEND_DL`` build ``dlopen``s at start-up (ldd cannot see those,
so each gets its own ldd). A library the binary links that is not found makes
the build unusable; a dynamically loaded backend whose libraries are missing is
only skipped by ggml, so the build keeps running without that backend.

The build's name (label or path) is consulted only for what the libraries cannot
tell: the CUDA major of a build with a static CUDA runtime, and the instruction
set a single ``libggml-cpu.so`` was compiled for (Jan's names ``avx512``, ``avx2``...).
"""

from __future__ import annotations

import enum
import logging
import re
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

import attrs

from troupe.hardware.host import machine_arch
from troupe.hardware.listdevices import DeviceListError, ListedDevice
from troupe.procs import run_captured

__all__ = [
    "Backend",
    "EngineBuild",
    "LddError",
    "inspect_build",
    "parse_ldd",
    "run_ldd",
]

log = logging.getLogger(__name__)


class Backend(enum.StrEnum):
    CUDA = "cuda"
    VULKAN = "vulkan"
    HIP = "hip"
    SYCL = "sycl"
    MUSA = "musa"
    OPENCL = "opencl"
    CANN = "cann"
    METAL = "metal"


_GGML_LIB = re.compile(r"^libggml-([a-z0-9]+)(?:-([a-z0-9_]+))?\.so(?:\.[0-9.]+)?$")
_CUDART = re.compile(r"^lib(?:cudart|cublas|cublasLt)\.so\.(\d+)")
_CUDA_NAME = re.compile(r"cu(?:da)?[-_.]?(\d{2})", re.IGNORECASE)
_GPU_BY_LIB = {b.value: b for b in Backend}
# libraries that mean a backend even when ggml's own library is named differently
_RUNTIME_LIBS = {"libvulkan.so": Backend.VULKAN, "libamdhip64.so": Backend.HIP}


class LddError(Exception):
    """``ldd`` could not report on a file (not a dynamic executable, no ldd...)."""


def parse_ldd(text: str) -> dict[str, str | None]:
    """``soname -> resolved path`` from ldd's output; None for ``=> not found``."""
    libs: dict[str, str | None] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if "=>" in line:
            name, _, target = line.partition("=>")
            target = target.strip()
            if target.startswith("not found"):
                libs[name.strip()] = None
            else:
                libs[name.strip()] = target.split(" (", 1)[0].strip() or None
        elif line and not line.startswith(("linux-vdso", "linux-gate", "statically linked")):
            path = line.split(" (", 1)[
                0
            ].strip()  # the loader: "/lib64/ld-linux-x86-64.so.2 (0x...)"
            libs[Path(path).name] = path
    return libs


def run_ldd(path: Path, timeout: float = 30.0) -> dict[str, str | None]:
    """``ldd <path>``, parsed. LddError when ldd is absent or refuses the file."""
    try:
        done = run_captured(["ldd", str(path)], timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LddError(f"ldd failed on {path}: {exc}") from None
    if done.returncode != 0:
        msg = done.stderr.strip() or done.stdout.strip() or f"exit code {done.returncode}"
        raise LddError(f"ldd {path}: {msg.splitlines()[-1]}")
    return parse_ldd(done.stdout)


Ldd = Callable[[Path], Mapping[str, str | None]]


@attrs.frozen
class EngineBuild:
    """One configured engine binary, as inspected (host-independent facts only)."""

    path: Path
    label: str
    backends: frozenset[Backend] = frozenset()  # GPU backends that will load
    cuda_major: int | None = None  # CUDA runtime major (11, 12, 13) of a CUDA build
    cpu_variant: str = "x64"  # Jan's names: common_cpus, avx512, avx2, avx, noavx, arm64, x64
    missing: tuple[str, ...] = ()  # libraries the binary links that are not found: unusable
    skipped_backends: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)
    problem: str | None = None  # why the build cannot run at all, in words
    libraries_checked: bool = True  # False when ldd could not be run
    devices: tuple[ListedDevice, ...] | None = None  # its --list-devices, None if not run
    devices_error: str | None = None

    @property
    def runnable(self) -> bool:
        return self.problem is None

    def describe(self) -> str:
        """``CUDA 12 + CPU (x64)`` style summary."""
        parts = []
        for b in sorted(self.backends):
            if b is Backend.CUDA:
                parts.append(f"CUDA {self.cuda_major}" if self.cuda_major else "CUDA")
            else:
                parts.append(b.value.capitalize() if b is not Backend.HIP else "HIP")
        parts.append(f"CPU ({self.cpu_variant})")
        return " + ".join(parts)


def _backend_of(soname: str) -> Backend | None:
    m = _GGML_LIB.match(Path(soname).name)
    if m:
        return _GPU_BY_LIB.get(m.group(1))
    base = soname.split(".so", 1)[0] + ".so"
    return _RUNTIME_LIBS.get(base)


def _cuda_major(libs: Mapping[str, str | None], name: str) -> int | None:
    for soname in libs:
        m = _CUDART.match(soname)
        if m:
            return int(m.group(1))
    m = _CUDA_NAME.search(name)
    return int(m.group(1)) if m else None


def _cpu_variant(directory_names: list[str], name: str, arch: str) -> str:
    variants = {
        m.group(2)
        for n in directory_names
        if (m := _GGML_LIB.match(n)) and m.group(1) == "cpu" and m.group(2)
    }
    if variants:  # GGML_CPU_ALL_VARIANTS: ggml picks the best variant at run time
        return "common_cpus"
    lowered = name.lower()
    for variant in ("common_cpus", "avx512", "avx2", "noavx", "avx"):
        if variant in lowered:
            return variant
    return "arm64" if arch == "aarch64" else "x64"


def _dynamic_backends(directory: Path, linked: set[str]) -> list[Path]:
    """``libggml-<gpu>.so`` files beside the binary that it does not link (BACKEND_DL)."""
    out: dict[Path, Path] = {}
    try:
        entries = sorted(directory.iterdir())
    except OSError:
        return []
    for entry in entries:
        m = _GGML_LIB.match(entry.name)
        if not m or m.group(1) not in _GPU_BY_LIB:
            continue
        real = entry.resolve()
        if str(real) not in linked and real not in out:
            out[real] = entry
    return list(out.values())


def _load_dynamic(
    libs: list[Path], ldd: Ldd, check: bool
) -> tuple[set[Backend], dict[str, str | None], dict[str, tuple[str, ...]]]:
    """The backends among `libs` that will load, their dependencies, and the ones that
    will not (with the missing libraries). Without a working ldd (`check` False) a
    backend file's presence is all there is to go on."""
    backends: set[Backend] = set()
    found: dict[str, str | None] = {}
    skipped: dict[str, tuple[str, ...]] = {}
    for lib in libs:
        backend = _backend_of(lib.name)
        if backend is None:
            continue
        if not check:
            backends.add(backend)
            continue
        try:
            deps = dict(ldd(lib))
        except LddError as exc:
            skipped[lib.name] = (str(exc),)
            continue
        absent = tuple(n for n, p in deps.items() if p is None)
        if absent:
            skipped[lib.name] = absent
        else:
            backends.add(backend)
            found.update(deps)
    return backends, found, skipped


def inspect_build(
    path: Path,
    label: str | None = None,
    *,
    arch: str | None = None,
    ldd: Ldd = run_ldd,
    list_devices: Callable[[Path], tuple[ListedDevice, ...]] | None = None,
) -> EngineBuild:
    """Inspect `path` (blocking: subprocesses). `arch` defaults to this machine's.
    `list_devices` (``run_list_devices``), when given, is run on a build whose
    libraries are all there; its failure is kept in `devices_error`, not raised."""
    label = label or str(path)
    name = f"{label} {path}"
    try:
        libs = dict(ldd(path))
    except LddError as exc:
        # A static binary or no ldd: nothing to verify; the build's own start will tell.
        log.debug("%s", exc)
        libs = {}
        checked = False
    else:
        checked = True
    missing = tuple(n for n, p in libs.items() if p is None)
    backends = {b for n in libs if (b := _backend_of(n)) is not None}
    directory = path.resolve().parent
    linked = {str(Path(p).resolve()) for p in libs.values() if p}
    more, deps, skipped = _load_dynamic(_dynamic_backends(directory, linked), ldd, checked)
    backends |= more
    all_libs = {**libs, **deps}
    try:
        names = [e.name for e in directory.iterdir()]
    except OSError:
        names = []
    problem = None
    if missing:
        problem = f"missing shared libraries: {', '.join(missing)}"
    build = EngineBuild(
        path=path,
        label=label,
        backends=frozenset(backends),
        cuda_major=_cuda_major(all_libs, name) if Backend.CUDA in backends else None,
        cpu_variant=_cpu_variant(names, name, arch or machine_arch()),
        missing=missing,
        skipped_backends=skipped,
        problem=problem,
        libraries_checked=checked,
    )
    if list_devices is None or problem is not None:
        return build
    try:
        return attrs.evolve(build, devices=list_devices(path))
    except DeviceListError as exc:
        return attrs.evolve(build, devices_error=str(exc))
