"""GPU placement as engine flags: rendered, read back from a command line, and checked
by the real engine's own argument parser (the CPU build: it knows no CUDA device, so
``--device CUDA0`` must be refused by its device parser and nothing else)."""

from __future__ import annotations

from pathlib import Path

import attrs

from troupe.assembly import gpu_ids
from troupe.child.argcheck import engine_refusal
from troupe.child.gpu_flags import gpu_flags, gpu_request
from troupe.engine import Engine
from troupe.hardware.devices import DeviceList
from troupe.hardware.gpu_ids import engine_gpu_ids
from troupe.hardware.host import HostMemory
from troupe.hardware.listdevices import ListedDevice
from troupe.hardware.nvml import GpuDevice, GpuReport
from troupe.sched.devices import GpuPlan, GpuRequest
from troupe.settings.router import RouterSettings

GiB = 1 << 30
IDS = {f"cuda:{i}": f"CUDA{i}" for i in range(8)}
NAMES = {v: k for k, v in IDS.items()}


def _none(_flag: str) -> bool:
    return False


def test_flags_for_one_card_several_and_part() -> None:
    assert gpu_flags(GpuPlan(("cuda:3",)), IDS, _none) == ["--device", "CUDA3"]
    several = GpuPlan(("cuda:1", "cuda:5"), (20000, 10000))
    assert gpu_flags(several, IDS, _none) == [
        "--device",
        "CUDA1,CUDA5",
        "--split-mode",
        "layer",
        "--tensor-split",
        "20000,10000",
    ]
    part = GpuPlan(("cuda:0",), (), 12)
    assert gpu_flags(part, IDS, _none) == ["--device", "CUDA0", "--n-gpu-layers", "12"]
    assert gpu_flags(part, IDS, lambda f: f == "--n-gpu-layers") == ["--device", "CUDA0"]
    assert gpu_flags(GpuPlan((), (), 0), IDS, _none) == ["--device", "none"]
    assert gpu_flags(GpuPlan(("cuda:0",), fixed=True), IDS, _none) == []


def test_a_command_lines_own_device_flags() -> None:
    def get(flags: dict[str, str]):  # type: ignore[no-untyped-def]
        return flags.get

    assert gpu_request(get({}), NAMES) is None
    assert gpu_request(get({"--device": "CUDA2,CUDA4"}), NAMES) == GpuRequest(("cuda:2", "cuda:4"))
    assert gpu_request(get({"--device": "none"}), NAMES) == GpuRequest(())
    assert gpu_request(get({"--device": "Vulkan0"}), NAMES) == GpuRequest(None)
    none_mode = {"--split-mode": "none", "--main-gpu": "3"}
    assert gpu_request(get(none_mode), NAMES) == GpuRequest(("cuda:3",))
    assert gpu_request(get({"--split-mode": "none"}), NAMES) == GpuRequest(("cuda:0",))
    assert gpu_request(get({"--tensor-split": "0,3,0,1"}), NAMES) == GpuRequest(
        ("cuda:1", "cuda:3")
    )
    assert gpu_request(get({"--device": "CUDA4,CUDA6", "--tensor-split": "0,1"}), NAMES) == (
        GpuRequest(("cuda:6",))
    )
    assert gpu_request(get({"--split-mode": "row"}), NAMES) == GpuRequest(None)


def test_the_engines_own_parser_takes_the_rendered_flags(engine_path: Path) -> None:
    """Every flag troupe renders is one the engine's parser takes, spelled as it spells
    it; ``--device`` reaches its device-list parser, which a CPU build answers with
    'invalid device' (it has no CUDA device: the flag is only rendered with one)."""
    rendered = gpu_flags(
        GpuPlan(("cuda:0", "cuda:1", "cuda:2"), (40000, 40000, 1000), 30), IDS, _none
    )
    assert rendered[:2] == ["--device", "CUDA0,CUDA1,CUDA2"]
    assert engine_refusal([str(engine_path), *rendered[2:]]) is None
    refusal = engine_refusal([str(engine_path), *rendered])
    assert refusal is not None
    assert "--device" in refusal
    assert "invalid device: CUDA0" in refusal
    assert engine_refusal([str(engine_path), "--device", "none"]) is None
    assert engine_refusal([str(engine_path), "--device", "none", "--n-gpu-layers", "0"]) is None
    # a spelling the engine does not have would be refused by the same check
    assert engine_refusal([str(engine_path), "--tensor-splits", "1,1"]) is not None


def _gpu(i: int, total_gib: int, uuid: str) -> GpuDevice:
    return GpuDevice(i, f"GPU{i}", uuid, None, total_gib * GiB, total_gib * GiB, 0, (9, 0), ())


def test_engine_ids_match_nvmls_gpus_only_when_they_agree() -> None:
    gpus = [_gpu(0, 80, "GPU-aaaa"), _gpu(1, 24, "GPU-bbbb")]
    listed = [
        ListedDevice("CUDA0", "H100", 81000, 80000),
        ListedDevice("CUDA1", "L4", 24000, 23000),
    ]
    assert engine_gpu_ids(gpus, listed, {}) == {"cuda:0": "CUDA0", "cuda:1": "CUDA1"}
    # CUDA_VISIBLE_DEVICES renumbers: the engine's CUDA0 is NVML's GPU 1
    only = [ListedDevice("CUDA0", "L4", 24000, 23000)]
    assert engine_gpu_ids(gpus, only, {"CUDA_VISIBLE_DEVICES": "GPU-bbbb"}) == {"cuda:1": "CUDA0"}
    assert engine_gpu_ids(gpus, only, {"CUDA_VISIBLE_DEVICES": "1"}) == {"cuda:1": "CUDA0"}
    # a CPU build lists none; sizes that disagree; an order troupe cannot tell
    assert engine_gpu_ids(gpus, [], {}) == {}
    assert engine_gpu_ids(gpus, listed[::-1], {}) == {}
    assert engine_gpu_ids(gpus, listed, {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}) == {}
    vulkan = [ListedDevice("Vulkan0", "H100", 81000, 80000)]
    assert engine_gpu_ids(gpus[:1], vulkan, {}) == {}


def test_a_cpu_build_places_no_child_though_nvml_sees_cards(engine_path: Path) -> None:
    """The engine troupe installs is a CPU build: NVML's cards are not its devices, so
    no device flag is ever rendered (a --device CUDA0 would fail every load)."""
    devices = DeviceList(
        HostMemory(64 * GiB, 60 * GiB),
        GpuReport((_gpu(0, 24, "GPU-aaaa"), _gpu(1, 24, "GPU-bbbb")), "580.65.06", 13000),
    )
    engine = Engine(engine_path, "test", "cpu")
    assert gpu_ids(RouterSettings(), engine, devices, {}) == {}
    off = attrs.evolve(RouterSettings(), gpu_placement="off")
    assert gpu_ids(off, Engine(Path("/nonexistent"), "test", "x"), devices, {}) == {}
    no_gpu = DeviceList(HostMemory(64 * GiB, 60 * GiB))
    assert gpu_ids(RouterSettings(), Engine(Path("/nonexistent"), "t", "x"), no_gpu, {}) == {}
