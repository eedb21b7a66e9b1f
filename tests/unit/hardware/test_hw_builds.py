"""Inspecting engine builds: ldd parsing, backends, CUDA runtime, CPU variant, missing libraries."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from troupe.hardware import (
    Backend,
    DeviceListError,
    LddError,
    ListedDevice,
    inspect_build,
    parse_ldd,
    run_ldd,
    run_list_devices,
)
from troupe.hardware.builds import Ldd

LDD_CUDA = """\
\tlinux-vdso.so.1 (0x00007ffc6a5f2000)
\tlibggml-cuda.so => /opt/cuda-build/libggml-cuda.so (0x00007f0c1c000000)
\tlibcudart.so.12 => not found
\tlibcublas.so.12 => /usr/local/cuda/lib64/libcublas.so.12 (0x00007f0c10000000)
\tlibcuda.so.1 => /lib/x86_64-linux-gnu/libcuda.so.1 (0x00007f0c0a000000)
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f0c09e00000)
\t/lib64/ld-linux-x86-64.so.2 (0x00007f0c2d6f4000)
"""


def test_parse_ldd() -> None:
    libs = parse_ldd(LDD_CUDA)
    assert libs["libcudart.so.12"] is None
    assert libs["libcublas.so.12"] == "/usr/local/cuda/lib64/libcublas.so.12"
    assert libs["ld-linux-x86-64.so.2"] == "/lib64/ld-linux-x86-64.so.2"
    assert "linux-vdso.so.1" not in libs
    assert parse_ldd("\tstatically linked\n") == {}


@pytest.mark.engine
def test_run_ldd_on_the_real_engine(engine_path: Path) -> None:
    libs = run_ldd(engine_path)
    assert "libllama.so.0" in libs
    assert all(path is not None for path in libs.values())


def test_run_ldd_refuses_a_text_file(tmp_path: Path) -> None:
    script = tmp_path / "llama-server"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(LddError):
        run_ldd(script)


@pytest.mark.engine
def test_the_real_engine_is_a_cpu_build(engine_path: Path) -> None:
    build = inspect_build(engine_path, "pinned", list_devices=run_list_devices)
    assert build.runnable
    assert build.backends == frozenset()
    assert build.missing == ()
    assert build.libraries_checked
    assert build.devices == ()
    assert build.describe().startswith("CPU (")


def _engine_dir(tmp_path: Path, *libs: str, name: str = "build") -> Path:
    d = tmp_path / name
    d.mkdir()
    exe = d / "llama-server"
    exe.write_bytes(b"\x7fELF")
    for lib in libs:
        (d / lib).write_bytes(b"\x7fELF")
    return exe


def _ldd(answers: Mapping[str, Mapping[str, str | None] | Exception]) -> Ldd:
    """An ldd that answers by file name."""

    def ldd(path: Path) -> Mapping[str, str | None]:
        answer = answers[path.name]
        if isinstance(answer, Exception):
            raise answer
        return answer

    return ldd


def test_cuda_linked_in_with_its_runtime(tmp_path: Path) -> None:
    exe = _engine_dir(tmp_path, "libggml-cuda.so")
    libs = {
        "libggml-cuda.so": str(exe.parent / "libggml-cuda.so"),
        "libcudart.so.12": "/usr/local/cuda/lib64/libcudart.so.12",
        "libc.so.6": "/lib/libc.so.6",
    }
    build = inspect_build(exe, "cuda", arch="x86_64", ldd=_ldd({"llama-server": libs}))
    assert build.backends == {Backend.CUDA}
    assert build.cuda_major == 12
    assert build.runnable
    assert build.describe() == "CUDA 12 + CPU (x64)"


def test_missing_runtime_makes_the_build_unusable_and_is_named(tmp_path: Path) -> None:
    exe = _engine_dir(tmp_path)
    build = inspect_build(exe, ldd=_ldd({"llama-server": parse_ldd(LDD_CUDA)}))
    assert not build.runnable
    assert build.missing == ("libcudart.so.12",)
    assert build.problem == "missing shared libraries: libcudart.so.12"
    assert build.cuda_major == 12  # read from the soname even though it is missing
    assert build.label == str(exe)


def test_dynamic_backends_and_all_cpu_variants(tmp_path: Path) -> None:
    exe = _engine_dir(
        tmp_path,
        "libggml-cuda.so",
        "libggml-vulkan.so",
        "libggml-cpu-haswell.so",
        "libggml-cpu-skylakex.so",
        "libggml-base.so",
    )
    ldd = _ldd(
        {
            "llama-server": {"libggml-base.so": str(exe.parent / "libggml-base.so")},
            "libggml-cuda.so": {"libcudart.so.13": "/usr/lib/libcudart.so.13"},
            "libggml-vulkan.so": {"libvulkan.so.1": "/usr/lib/libvulkan.so.1"},
        }
    )
    build = inspect_build(exe, "all", arch="x86_64", ldd=ldd)
    assert build.backends == {Backend.CUDA, Backend.VULKAN}
    assert build.cuda_major == 13
    assert build.cpu_variant == "common_cpus"
    assert build.describe() == "CUDA 13 + Vulkan + CPU (common_cpus)"


def test_a_dynamic_backend_that_cannot_load_is_skipped_not_fatal(tmp_path: Path) -> None:
    exe = _engine_dir(tmp_path, "libggml-cuda.so", "libggml-hip.so")
    ldd = _ldd(
        {
            "llama-server": {},
            "libggml-cuda.so": {"libcudart.so.12": None, "libcublas.so.12": None},
            "libggml-hip.so": LddError("ldd libggml-hip.so: not a dynamic executable"),
        }
    )
    build = inspect_build(exe, "dl", ldd=ldd)
    assert build.runnable
    assert build.backends == frozenset()
    assert build.skipped_backends == {
        "libggml-cuda.so": ("libcudart.so.12", "libcublas.so.12"),
        "libggml-hip.so": ("ldd libggml-hip.so: not a dynamic executable",),
    }


def test_symlinked_backend_is_inspected_once(tmp_path: Path) -> None:
    exe = _engine_dir(tmp_path, "libggml-vulkan.so.0.26.0")
    (exe.parent / "libggml-vulkan.so").symlink_to("libggml-vulkan.so.0.26.0")
    (exe.parent / "libggml-vulkan.so.0").symlink_to("libggml-vulkan.so.0.26.0")
    seen: list[str] = []

    def ldd(path: Path) -> Mapping[str, str | None]:
        seen.append(path.name)
        return {}

    build = inspect_build(exe, ldd=ldd)
    assert build.backends == {Backend.VULKAN}
    assert seen == ["llama-server", "libggml-vulkan.so"]


def test_linked_backend_is_not_inspected_again(tmp_path: Path) -> None:
    exe = _engine_dir(tmp_path, "libggml-vulkan.so")
    seen: list[str] = []

    def ldd(path: Path) -> Mapping[str, str | None]:
        seen.append(path.name)
        return {"libggml-vulkan.so": str(exe.parent / "libggml-vulkan.so")}

    assert inspect_build(exe, ldd=ldd).backends == {Backend.VULKAN}
    assert seen == ["llama-server"]


@pytest.mark.parametrize(
    ("dirname", "label", "arch", "variant"),
    [
        ("llama-b6325-bin-linux-avx2-x64", None, "x86_64", "avx2"),
        ("build", "avx512", "x86_64", "avx512"),
        ("build", "noavx", "x86_64", "noavx"),
        ("build", "avx", "x86_64", "avx"),
        ("build", "cpu", "x86_64", "x64"),
        ("build", "cpu", "aarch64", "arm64"),
    ],
)
def test_cpu_variant_from_the_name(
    tmp_path: Path, dirname: str, label: str | None, arch: str, variant: str
) -> None:
    exe = _engine_dir(tmp_path, name=dirname)
    build = inspect_build(exe, label, arch=arch, ldd=_ldd({"llama-server": {}}))
    assert build.cpu_variant == variant


def test_cuda_major_from_the_name_when_the_runtime_is_static(tmp_path: Path) -> None:
    exe = _engine_dir(tmp_path, "libggml-cuda.so", name="linux-cuda-12-common_cpus-x64")
    ldd = _ldd({"llama-server": {}, "libggml-cuda.so": {"libcuda.so.1": "/lib/libcuda.so.1"}})
    build = inspect_build(exe, ldd=ldd)
    assert (build.cuda_major, build.cpu_variant) == (12, "common_cpus")


def test_no_ldd_means_unchecked_but_runnable(tmp_path: Path) -> None:
    exe = _engine_dir(tmp_path, "libggml-cuda.so")

    def no_ldd(path: Path) -> Mapping[str, str | None]:
        raise LddError("ldd failed: No such file or directory")

    build = inspect_build(exe, ldd=no_ldd)
    assert build.runnable
    assert not build.libraries_checked
    # the backend file is all there is to go on: counted, not reported as broken
    assert build.backends == {Backend.CUDA}
    assert build.skipped_backends == {}


def test_list_devices_is_asked_only_of_runnable_builds(tmp_path: Path) -> None:
    exe = _engine_dir(tmp_path)
    asked: list[Path] = []

    def listing(path: Path) -> tuple[ListedDevice, ...]:
        asked.append(path)
        return (ListedDevice("CUDA0", "G", 100, 50),)

    ok = inspect_build(exe, ldd=_ldd({"llama-server": {}}), list_devices=listing)
    assert ok.devices == (ListedDevice("CUDA0", "G", 100, 50),)
    broken = inspect_build(
        exe,
        ldd=_ldd({"llama-server": {"libcudart.so.12": None}}),
        list_devices=listing,
    )
    assert broken.devices is None
    assert asked == [exe]


def test_list_devices_failure_is_kept(tmp_path: Path) -> None:
    exe = _engine_dir(tmp_path)

    def listing(path: Path) -> tuple[ListedDevice, ...]:
        raise DeviceListError("no 'Available devices:' line")

    build = inspect_build(exe, ldd=_ldd({"llama-server": {}}), list_devices=listing)
    assert build.devices is None
    assert build.devices_error == "no 'Available devices:' line"
