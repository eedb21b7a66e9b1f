"""The device list: every NVML path through a fake NVML, host RAM and RSS through psutil."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from hw_fakes import (
    DRIVER_NOT_LOADED,
    GIB,
    GPU_IS_LOST,
    LIBRARY_NOT_FOUND,
    NO_PERMISSION,
    NOT_SUPPORTED,
    FakeGpu,
    FakeNvml,
)

from troupe.actors.memory import MemorySampler
from troupe.hardware import (
    DeviceList,
    DeviceReader,
    GpuReport,
    HostMemory,
    aprocess_rss,
    aread_devices,
    cpu_features,
    load_nvml,
    machine_arch,
    process_rss,
    read_cpu_features,
    read_devices,
    read_gpus,
    read_host_memory,
)
from troupe.hardware.nvml import NvmlSession

# -- NVML through the fake ---------------------------------------------------------


def test_no_gpu_is_an_empty_list_with_the_driver_still_read() -> None:
    nvml = FakeNvml([])
    report = read_gpus(nvml)
    assert report.gpus == ()
    assert report.absent_reason == "NVML sees no GPU"
    assert report.driver_version == "550.54.14"
    assert report.cuda_version == (12, 4)
    assert (nvml.inits, nvml.shutdowns) == (1, 1)


def test_one_gpu_every_field() -> None:
    gpu = FakeGpu(processes=[(4242, 3 * GIB), (777, 512 << 20)])
    (g,) = read_gpus(FakeNvml([gpu])).gpus
    assert g.index == 0
    assert g.name == "NVIDIA Fake 24G"
    assert g.uuid == "GPU-00000000-0000-0000-0000-000000000000"
    assert g.pci_bus_id == "00000000:01:00.0"  # bytes from the ctypes struct, decoded
    assert (g.total, g.free, g.used) == (24 * GIB, 20 * GIB, 4 * GIB)
    assert g.compute_capability == (8, 9)
    assert g.used_by(4242) == 3 * GIB
    assert g.used_by(1) == 0  # no context on this GPU


def test_bytes_from_older_bindings_are_decoded() -> None:
    gpu = FakeGpu(name=b"Tesla T4", uuid=b"GPU-t4", bus_id="00000000:3B:00.0")
    report = read_gpus(FakeNvml([gpu], driver=b"535.104.05"))
    (g,) = report.gpus
    assert (g.name, g.uuid, g.pci_bus_id) == ("Tesla T4", "GPU-t4", "00000000:3B:00.0")
    assert report.driver_version == "535.104.05"


def test_two_gpus_and_per_process_memory_none() -> None:
    gpus = [
        FakeGpu(name="A", total=80 * GIB, processes=[(10, 2 * GIB)]),
        FakeGpu(name="B", total=16 * GIB, processes=[(10, None)]),  # WDDM: unknown
    ]
    devices = DeviceList(HostMemory(64 * GIB, 60 * GIB), read_gpus(FakeNvml(gpus)))
    assert [g.name for g in devices.gpus] == ["A", "B"]
    assert [g.index for g in devices.gpus] == [0, 1]
    assert devices.gpus[1].used_by(10) is None
    assert devices.gpu_used_by(10) == {0: 2 * GIB, 1: None}
    assert devices.gpu_used_by(11) == {}


@pytest.mark.parametrize("code", [LIBRARY_NOT_FOUND, DRIVER_NOT_LOADED])
def test_nvml_that_cannot_start_means_no_gpus(code: int) -> None:
    nvml = FakeNvml([FakeGpu()], fail={"nvmlInit": code})
    report = read_gpus(nvml)
    assert report.gpus == ()
    assert report.absent_reason is not None
    assert report.absent_reason.startswith("NVML: ")
    assert nvml.calls == ["nvmlInit"]  # nothing else asked, and no shutdown of what never began
    assert nvml.shutdowns == 0


def test_library_not_found_reason_is_nvmls_words() -> None:
    report = read_gpus(FakeNvml(fail={"nvmlInit": LIBRARY_NOT_FOUND}))
    assert report.absent_reason == "NVML: NVML Shared Library Not Found"


def test_count_failure_means_no_gpus() -> None:
    report = read_gpus(FakeNvml([FakeGpu()], fail={"nvmlDeviceGetCount": GPU_IS_LOST}))
    assert report.gpus == ()
    assert report.absent_reason == "NVML: cannot count devices: GPU is lost"


@pytest.mark.parametrize("call", ["nvmlDeviceGetHandleByIndex", "nvmlDeviceGetMemoryInfo"])
def test_a_gpu_without_handle_or_memory_is_left_out(call: str) -> None:
    nvml = FakeNvml([FakeGpu(name="lost"), FakeGpu(name="fine")], fail={(call, 0): GPU_IS_LOST})
    report = read_gpus(nvml)
    assert [(g.index, g.name) for g in report.gpus] == [(1, "fine")]
    assert report.absent_reason is None


def test_every_gpu_unreadable() -> None:
    nvml = FakeNvml([FakeGpu()], fail={"nvmlDeviceGetMemoryInfo": GPU_IS_LOST})
    assert read_gpus(nvml).absent_reason == "no GPU could be read"


def test_optional_fields_fail_alone_and_the_gpu_stays() -> None:
    fail: dict[str | tuple[str, int], int] = {
        "nvmlDeviceGetName": NOT_SUPPORTED,
        "nvmlDeviceGetUUID": NO_PERMISSION,
        "nvmlDeviceGetPciInfo": NOT_SUPPORTED,
        "nvmlDeviceGetCudaComputeCapability": NOT_SUPPORTED,
        "nvmlDeviceGetComputeRunningProcesses": NO_PERMISSION,
        "nvmlSystemGetDriverVersion": NOT_SUPPORTED,
        "nvmlSystemGetCudaDriverVersion": NOT_SUPPORTED,
    }
    report = read_gpus(FakeNvml([FakeGpu(total=8 * GIB)], fail=fail))
    (g,) = report.gpus
    assert g.name == "GPU 0"
    assert (g.uuid, g.pci_bus_id, g.compute_capability, g.processes) == (None, None, None, None)
    assert g.total == 8 * GIB
    assert g.used_by(1) is None  # processes unknown: so is any pid's use
    assert (report.driver_version, report.cuda_driver_version, report.cuda_version) == (
        None,
        None,
        None,
    )


def test_processes_failing_on_one_gpu_only() -> None:
    gpus = [FakeGpu(processes=[(5, GIB)]), FakeGpu(processes=[(5, GIB)])]
    nvml = FakeNvml(gpus, fail={("nvmlDeviceGetComputeRunningProcesses", 1): NOT_SUPPORTED})
    report = read_gpus(nvml)
    assert report.gpus[0].processes is not None
    assert report.gpus[1].processes is None


@pytest.mark.parametrize(("raw", "version"), [(12040, (12, 4)), (13000, (13, 0)), (11080, (11, 8))])
def test_cuda_driver_version(raw: int, version: tuple[int, int]) -> None:
    assert GpuReport(cuda_driver_version=raw).cuda_version == version


def test_session_reads_many_times_with_one_init() -> None:
    nvml = FakeNvml([FakeGpu()])
    with NvmlSession.open(nvml) as session:
        assert session.active
        nvml.gpus[0].free = 1 * GIB
        first = session.read()
        nvml.gpus[0].free = 2 * GIB
        second = session.read()
    assert (first.gpus[0].free, second.gpus[0].free) == (GIB, 2 * GIB)
    assert (nvml.inits, nvml.shutdowns) == (1, 1)
    session.close()  # idempotent
    assert nvml.shutdowns == 1
    assert session.read().gpus == ()


def test_shutdown_error_is_swallowed() -> None:
    nvml = FakeNvml([FakeGpu()], fail={"nvmlShutdown": NOT_SUPPORTED})
    assert len(read_gpus(nvml).gpus) == 1
    assert nvml.shutdowns == 1


def test_no_bindings_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    assert load_nvml() is None
    devices = read_devices()
    assert devices.gpus == ()
    assert devices.gpu_report.absent_reason == "nvidia-ml-py is not installed"


def test_explicit_no_nvml() -> None:
    assert read_devices(None).gpu_report.absent_reason == "nvidia-ml-py is not installed"


def test_real_nvml_on_this_machine_never_raises() -> None:
    devices = read_devices()
    assert devices.host.total >= devices.host.available > 0
    if not devices.gpus:
        assert devices.gpu_report.absent_reason


# -- the reader, sync and async ------------------------------------------------------


def test_reader_combines_host_and_gpus() -> None:
    nvml = FakeNvml([FakeGpu(), FakeGpu(name="second")])
    vm = SimpleNamespace(total=32 * GIB, available=30 * GIB, free=1)
    with DeviceReader(nvml, virtual_memory=lambda: vm) as reader:
        devices = reader.read()
        vm.available = 10 * GIB
        again = reader.read()
    assert devices.host == HostMemory(32 * GIB, 30 * GIB)
    assert again.host.available == 10 * GIB
    assert len(devices.gpus) == 2
    assert devices.driver_version == "550.54.14"
    assert devices.cuda_version == (12, 4)
    assert nvml.inits == 1
    assert nvml.shutdowns == 1


async def test_async_reads_run_in_a_thread() -> None:
    nvml = FakeNvml([FakeGpu()])
    devices = await aread_devices(nvml)
    assert len(devices.gpus) == 1
    assert devices.host.total > 0
    reader = DeviceReader(nvml)
    try:
        assert len((await reader.aread()).gpus) == 1
    finally:
        reader.close()


def test_only_a_reader_without_nvml_is_quick_enough_to_read_in_place() -> None:
    # The scheduler reads a host-only sampler on its own task (two /proc files); an NVML
    # session's calls go to a worker thread.
    with DeviceReader(None) as host, DeviceReader(FakeNvml([FakeGpu()])) as gpus:
        assert host.host_only
        assert MemorySampler(host).quick
        assert not gpus.host_only
        assert not MemorySampler(gpus).quick
        sample = MemorySampler(host).sample([os.getpid()])
    assert [d.name for d in sample.devices] == ["host"]
    assert sample.usage[os.getpid()]["host"] > 0


# -- host ------------------------------------------------------------------------------


def test_host_memory_uses_available_not_free() -> None:
    vm = SimpleNamespace(total=16 * GIB, available=12 * GIB, free=2 * GIB)
    assert read_host_memory(lambda: vm) == HostMemory(16 * GIB, 12 * GIB)


def test_rss_of_this_process() -> None:
    assert (process_rss(os.getpid()) or 0) > 1 << 20


def test_rss_of_a_reused_pid_reads_as_gone() -> None:
    assert process_rss(os.getpid(), create_time=1.0) is None


def test_rss_of_a_process_that_is_gone() -> None:
    # above Linux's largest pid_max (2**22): never a live process
    assert process_rss(2**22 + 1) is None


async def test_async_rss() -> None:
    assert (await aprocess_rss(os.getpid()) or 0) > 0


X86 = """processor\t: 0
vendor_id\t: GenuineIntel
flags\t\t: fpu vme sse4_1 sse4_2 avx f16c fma avx2 avx512f avx512bw amx_tile amx_int8 ht
bugs\t\t: spectre_v1

processor\t: 1
flags\t\t: fpu vme sse4_1
"""
ARM = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes sve i8mm bf16
"""


def test_cpu_features_x86_first_cpu_only() -> None:
    assert cpu_features(X86) == {
        "sse4_1",
        "sse4_2",
        "avx",
        "f16c",
        "fma",
        "avx2",
        "avx512f",
        "avx512bw",
        "amx_tile",
        "amx_int8",
    }


def test_cpu_features_arm_and_none() -> None:
    assert cpu_features(ARM) == {"asimd", "sve", "i8mm"}
    assert cpu_features("processor: 0\n") == frozenset()


def test_read_cpu_features(tmp_path: Path) -> None:
    (tmp_path / "cpuinfo").write_text(X86)
    assert "avx512f" in read_cpu_features(tmp_path / "cpuinfo")
    assert read_cpu_features(tmp_path / "missing") == frozenset()


def test_this_machines_cpu_features_are_read() -> None:
    if os.path.exists("/proc/cpuinfo") and machine_arch() == "x86_64":
        assert "sse4_2" in read_cpu_features() or "avx" in read_cpu_features()


@pytest.mark.parametrize(
    ("raw", "arch"),
    [("x86_64", "x86_64"), ("AMD64", "x86_64"), ("arm64", "aarch64"), ("aarch64", "aarch64")],
)
def test_machine_arch(raw: str, arch: str) -> None:
    assert machine_arch(raw) == arch
