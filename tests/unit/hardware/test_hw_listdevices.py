"""``llama-server --list-devices``: the real engine's output and Jan's examples."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from troupe.hardware import DeviceListError, ListedDevice, parse_list_devices, run_list_devices
from troupe.hardware.listdevices import Runner


@pytest.mark.engine
def test_real_cpu_engine_lists_no_device(engine_path: Path) -> None:
    # the CPU build prints "Available devices:" then "  (none)" and exits 0
    assert run_list_devices(engine_path) == ()


def test_none_is_empty() -> None:
    assert parse_list_devices("Available devices:\n  (none)\n") == ()


@pytest.mark.parametrize(
    ("line", "device"),
    [
        (
            "  CUDA0: NVIDIA GeForce RTX 4090 (24564 MiB, 23980 MiB free)",
            ListedDevice("CUDA0", "NVIDIA GeForce RTX 4090", 24564, 23980),
        ),
        (  # the description holds parentheses of its own: the last group is the memory
            "  Vulkan0: Intel(R) Arc(tm) A750 Graphics (DG2) (8128 MiB, 8128 MiB free)",
            ListedDevice("Vulkan0", "Intel(R) Arc(tm) A750 Graphics (DG2)", 8128, 8128),
        ),
        (
            "  SYCL0: Intel(R) Arc(TM) A750 Graphics (8000 MiB, 7721 MiB free)",
            ListedDevice("SYCL0", "Intel(R) Arc(TM) A750 Graphics", 8000, 7721),
        ),
        (  # a colon in the description: only the first one splits
            "  ROCm0: AMD Radeon: RX 7900 XTX (24560 MiB, 24000 MiB free)",
            ListedDevice("ROCm0", "AMD Radeon: RX 7900 XTX", 24560, 24000),
        ),
        (  # two memory-looking groups: the last wins
            "  X0: odd (1 MiB, 1 MiB free) thing (2048 MiB, 1024 MiB free)",
            ListedDevice("X0", "odd (1 MiB, 1 MiB free) thing", 2048, 1024),
        ),
    ],
)
def test_device_lines(line: str, device: ListedDevice) -> None:
    assert parse_list_devices(f"Available devices:\n{line}\n") == (device,)


def test_several_devices_after_log_lines_and_blanks() -> None:
    out = (
        "ggml_cuda_init: found 2 CUDA devices:\n"
        "  Device 0: NVIDIA H100 80GB HBM3, compute capability 9.0\n"
        "Available devices:\n"
        "\n"
        "  CUDA0: NVIDIA H100 80GB HBM3 (81008 MiB, 80500 MiB free)\n"
        "  CUDA1: NVIDIA H100 80GB HBM3 (81008 MiB, 81000 MiB free)\n"
        "  Vulkan0: AMD Radeon Graphics (RADV GFX1103_R1) (16384 MiB, 15000 MiB free)\n"
    )
    devices = parse_list_devices(out)
    assert [d.id for d in devices] == ["CUDA0", "CUDA1", "Vulkan0"]
    assert [d.backend for d in devices] == ["CUDA", "CUDA", "Vulkan"]
    assert devices[2].name == "AMD Radeon Graphics (RADV GFX1103_R1)"
    assert devices[0].total_bytes == 81008 << 20
    assert devices[1].free_bytes == 81000 << 20


@pytest.mark.parametrize(
    "line",
    [
        "  (none)",
        "  CUDA0: no memory group",
        "  CUDA0: bad numbers (lots MiB, some MiB free)",
        "  CUDA0: three parts (1 MiB, 2 MiB free, 3 MiB)",
        "  CUDA0: not MiB (24 GiB, 20 GiB free)",
    ],
)
def test_unparseable_lines_are_skipped(line: str) -> None:
    good = "  CUDA1: fine (10 MiB, 5 MiB free)"
    assert [d.id for d in parse_list_devices(f"Available devices:\n{line}\n{good}\n")] == ["CUDA1"]


@pytest.mark.parametrize("out", ["", "usage: llama-server ...\n", "Available devices\n"])
def test_no_header_is_an_error(out: str) -> None:
    with pytest.raises(DeviceListError, match="Available devices:"):
        parse_list_devices(out)


def _runner(
    stdout: str = "", stderr: str = "", code: int = 0, exc: Exception | None = None
) -> Runner:
    def run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        assert argv[1:] == ["--list-devices"]
        assert timeout == 30.0
        if exc is not None:
            raise exc
        return subprocess.CompletedProcess(argv, code, stdout, stderr)

    return run


def test_run_parses_stdout() -> None:
    run = _runner("Available devices:\n  CUDA0: G (100 MiB, 50 MiB free)\n")
    (dev,) = run_list_devices(Path("/x/llama-server"), run=run)
    assert dev.id == "CUDA0"


def test_run_failure_names_the_last_stderr_line() -> None:
    run = _runner(stderr="loading\nerror while loading shared libraries: libcuda.so.1\n", code=127)
    with pytest.raises(DeviceListError, match=r"exit code 127\): error while loading .*libcuda"):
        run_list_devices(Path("/x/llama-server"), run=run)


@pytest.mark.parametrize(
    ("exc", "words"),
    [
        (subprocess.TimeoutExpired(["x"], 30), "within 30 s"),
        (PermissionError(13, "Permission denied"), "cannot be started: Permission denied"),
    ],
)
def test_run_that_cannot_finish(exc: Exception, words: str) -> None:
    with pytest.raises(DeviceListError, match=words):
        run_list_devices(Path("/x/llama-server"), run=_runner(exc=exc))
