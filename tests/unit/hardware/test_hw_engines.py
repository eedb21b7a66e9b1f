"""Choosing the engine build: Jan's priority, CUDA driver minimums, the 6 GiB rule."""

from __future__ import annotations

from pathlib import Path

import pytest
from hw_fakes import build, gpu_report

from troupe.hardware import (
    Backend,
    EngineBuild,
    HostFacts,
    choose_engine,
    compare_versions,
    judge,
    priority,
)

AVX512 = frozenset({"avx", "avx2", "avx512f", "fma", "f16c"})
AVX2 = frozenset({"avx", "avx2", "fma", "f16c"})


def host(
    *gpu_gib: float, driver: str | None = "550.54.14", cpu: frozenset[str] = AVX512
) -> HostFacts:
    return HostFacts("linux", "x86_64", cpu, gpu_report(*gpu_gib, driver=driver))


CPU = build("cpu")
CUDA11 = build("cuda11", Backend.CUDA, cuda=11)
CUDA12 = build("cuda12", Backend.CUDA, cuda=12)
CUDA13 = build("cuda13", Backend.CUDA, cuda=13)
VULKAN = build("vulkan", Backend.VULKAN)


def chosen(builds: list[EngineBuild], facts: HostFacts) -> str | None:
    c = choose_engine(builds, facts)
    return None if c.build is None else c.build.label


# -- the table ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "builds", "facts", "winner"),
    [
        ("cpu-only machine", [CPU, CUDA12, VULKAN], host(), "cpu"),
        ("cpu-only, GPU build listed first", [CUDA12, CPU], host(), "cpu"),
        ("cuda 12 driver", [CPU, CUDA12, CUDA13, VULKAN], host(24), "cuda12"),
        ("cuda 13 driver", [CPU, CUDA12, CUDA13], host(24, driver="580.65.06"), "cuda13"),
        ("cuda 13 needs exactly 580", [CUDA12, CUDA13], host(24, driver="580"), "cuda13"),
        ("old driver: cuda 11 only", [CPU, CUDA11, CUDA12], host(24, driver="470.82.01"), "cuda11"),
        ("very old driver", [CPU, CUDA11, CUDA12], host(24, driver="418.67"), "cpu"),
        ("small gpu: cuda still first", [CPU, CUDA12], host(4), "cuda12"),
        ("small gpu: vulkan demoted", [VULKAN, CPU], host(4), "cpu"),
        ("big gpu: vulkan above cpu", [CPU, VULKAN], host(8), "vulkan"),
        ("6 GiB exactly is enough", [CPU, VULKAN], host(6), "vulkan"),
        ("only vulkan, small gpu", [VULKAN], host(4), "vulkan"),
    ],
)
def test_choice_table(case: str, builds: list[EngineBuild], facts: HostFacts, winner: str) -> None:
    assert chosen(builds, facts) == winner, case


def test_cpu_variants_rank_and_need_their_instructions() -> None:
    builds = [build("noavx", cpu="noavx"), build("avx2", cpu="avx2"), build("avx512", cpu="avx512")]
    assert chosen(builds, host(cpu=AVX512)) == "avx512"
    c = choose_engine(builds, host(cpu=AVX2))
    assert c.build is not None
    assert c.build.label == "avx2"
    (avx512,) = [v for v in c.verdicts if v.build.label == "avx512"]
    assert avx512.category is None
    assert avx512.reason == "built for AVX512, which this CPU lacks"
    assert chosen([*builds, build("all", cpu="common_cpus")], host(cpu=AVX2)) == "all"
    assert chosen(builds, host(cpu=frozenset({"sse4_2"}))) == "noavx"


def test_arch_mismatch() -> None:
    arm = HostFacts("linux", "aarch64", frozenset({"asimd"}), gpu_report())
    assert chosen([build("x86"), build("arm", cpu="arm64")], arm) == "arm"
    assert judge(build("arm", cpu="arm64"), host()).category is None


def test_missing_libraries_rule_a_build_out_with_their_names() -> None:
    broken = build("cuda12", Backend.CUDA, cuda=12, missing=["libcudart.so.12", "libcublas.so.12"])
    c = choose_engine([broken, CPU], host(24))
    assert c.build is CPU
    verdict = c.verdicts[0]
    assert verdict.category is None
    assert verdict.reason == "missing shared libraries: libcudart.so.12, libcublas.so.12"


def test_nothing_can_run() -> None:
    c = choose_engine([build("a", missing=["libx.so.1"])], host())
    assert c.chosen is None
    assert c.reason == "no engine build can run here"
    assert choose_engine([], host()).reason == "no engine build configured"


def test_a_failing_list_devices_rules_a_build_out() -> None:
    v = judge(build("x", devices_error="exit code 1"), host())
    assert (v.category, v.reason) == (None, "--list-devices failed: exit code 1")


# -- CUDA details ---------------------------------------------------------------------------


def test_cuda_reasons() -> None:
    ok = judge(CUDA12, host(24))
    assert (ok.category, ok.reason) == (
        "cuda-cu12.0",
        "CUDA 12: NVIDIA driver 550.54.14 >= 525.60.13",
    )
    old = judge(CUDA13, host(24))
    assert old.category == "x64"
    assert old.fallback
    assert old.reason == (
        "CUDA unusable: CUDA 13 needs NVIDIA driver >= 580, this one is 550.54.14; "
        "runs on the CPU (x64)"
    )
    none = judge(CUDA12, host())
    assert none.reason.startswith("CUDA unusable: no NVIDIA GPU (NVML: NVML Shared Library")


def test_windows_minimums() -> None:
    win = HostFacts("windows", "x86_64", AVX512, gpu_report(24, driver="526.0"))
    assert judge(CUDA12, win).category == "x64"  # windows needs 527.41
    assert judge(CUDA11, win).category == "cuda-cu11.7"


def test_cuda_build_that_lists_no_cuda_device() -> None:
    blind = build("cuda12", Backend.CUDA, cuda=12, devices=[])
    v = judge(blind, host(24))
    assert v.category == "x64"
    assert "its --list-devices shows no CUDA device" in v.reason


def test_cuda_without_nvml_but_listing_devices() -> None:
    seen = build("cuda12", Backend.CUDA, cuda=12, devices=[("CUDA0", 24000)])
    v = judge(seen, host(driver=None))
    assert v.category == "cuda-cu12.0"
    assert v.reason == "CUDA 12: the build lists 1 CUDA device(s)"


def test_cuda_runtime_version_unknown() -> None:
    unknown = build("cuda", Backend.CUDA)
    assert judge(unknown, host(24)).category == "cuda"
    assert chosen([unknown, CUDA11], host(24)) == "cuda11"


# -- Vulkan and the 6 GiB rule -------------------------------------------------------------


def test_vulkan_memory_from_its_own_device_list() -> None:
    # an AMD card NVML cannot see: the build's --list-devices is the evidence and the size
    big = build("vulkan", Backend.VULKAN, devices=[("Vulkan0", 16384)])
    small = build("vulkan", Backend.VULKAN, devices=[("Vulkan0", 2048)])
    assert chosen([CPU, big], host()) == "vulkan"
    c = choose_engine([CPU, small], host())
    assert c.build is CPU
    assert not c.enough_gpu_memory
    assert (
        "the largest GPU has 2.0 GiB: Vulkan and other non-CUDA GPU builds rank below" in c.reason
    )


def test_vulkan_needs_a_device() -> None:
    assert judge(VULKAN, host()).category == "x64"  # no GPU, no render node
    with_node = HostFacts("linux", "x86_64", AVX512, gpu_report(), render_node=True)
    assert judge(VULKAN, with_node).category == "vulkan"
    listed_none = build("vulkan", Backend.VULKAN, devices=[])
    assert "its --list-devices shows no vulkan device" in judge(listed_none, with_node).reason


def test_other_gpu_backends_rank_like_vulkan() -> None:
    hip = build("hip", Backend.HIP, devices=[("ROCm0", 24560)])
    assert judge(hip, host()).category == "gpu"
    assert chosen([CPU, hip], host()) == "hip"


def test_skipped_backends_are_explained() -> None:
    dl = build("dl", skipped={"libggml-cuda.so": ("libcudart.so.12",)})
    v = judge(dl, host(24))
    assert v.reason == "libggml-cuda.so will not load (libcudart.so.12); runs on the CPU (x64)"


# -- reasons and helpers -----------------------------------------------------------------


def test_reason_in_words() -> None:
    c = choose_engine([CPU, CUDA12, VULKAN], host(24))
    assert c.reason == (
        "cuda12: CUDA 12: NVIDIA driver 550.54.14 >= 525.60.13; "
        "cuda-cu12.0 ranks above vulkan, x64; "
        "the largest GPU has 24.0 GiB: Vulkan and other non-CUDA GPU builds rank above CPU builds"
    )
    only = choose_engine([CPU], host())
    assert only.reason == "cpu: runs on the CPU (x64); the only usable build"
    twins = choose_engine([CPU, build("cpu2")], host())
    assert twins.reason.endswith("preferred among the x64 builds (configured order)")


def test_priority_lists() -> None:
    assert priority(True) == (
        "cuda-cu13.0", "cuda-cu12.0", "cuda-cu11.7", "cuda", "vulkan", "gpu",
        "common_cpus", "avx512", "avx2", "avx", "noavx", "arm64", "x64",
    )  # fmt: skip
    assert priority(False)[-2:] == ("vulkan", "gpu")
    assert priority(False)[:4] == priority(True)[:4]


@pytest.mark.parametrize(
    ("a", "b", "result"),
    [
        ("525.60.13", "525.60.13", 0),
        ("580", "580.0.0", 0),
        ("580.65.06", "580", 1),
        ("10.0", "2.0", 1),  # numeric, not string, comparison
        ("470.82.01", "525.60.13", -1),
        ("abc.1", "0.1", 0),  # an unparseable part counts as 0
    ],
)
def test_compare_versions(a: str, b: str, result: int) -> None:
    assert compare_versions(a, b) == result


def test_detect_this_host(tmp_path: Path) -> None:
    (tmp_path / "renderD128").touch()
    facts = HostFacts.detect(gpu_report(), dri=tmp_path)
    assert facts.render_node
    assert facts.os == "linux"
    assert not HostFacts.detect(gpu_report(), dri=tmp_path / "missing").render_node
