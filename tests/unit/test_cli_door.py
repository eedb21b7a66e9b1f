"""Mistakes at the door of the command line: each one line on stderr naming
the cause, a non-zero exit, never a traceback."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from troupe_rig import write_tiny_models
from troupe_rig.cli import assert_one_line_error, run_troupe


def _env(tmp_path: Path) -> dict[str, str]:
    # An empty Hugging Face cache and state dir of the test's own: only the flags count.
    return {"HF_HOME": str(tmp_path / "hf"), "TROUPE_STATE_DIR": str(tmp_path / "state")}


def _serve(engine: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    models = tmp_path / "models"
    models.mkdir(exist_ok=True)
    return run_troupe(
        "serve", "--engine", str(engine), "--models-dir", str(models), *args, env=_env(tmp_path)
    )


def test_port_in_use(fake_engine_path: Path, tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = _serve(fake_engine_path, tmp_path, "--port", str(port))
    assert_one_line_error(done, f"127.0.0.1:{port}", "already in use")


def test_host_that_is_no_address(fake_engine_path: Path, tmp_path: Path) -> None:
    done = _serve(fake_engine_path, tmp_path, "--host", "999.1.1.1", "--port", "0")
    assert_one_line_error(done, "--host 999.1.1.1", "not an address")


_SETPRIV = shutil.which("setpriv")


def _without_privileges(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """troupe without the capabilities that let root bind low ports and read any file
    (so the test means the same as root and as a user)."""
    assert _SETPRIV is not None
    caps = "-net_bind_service,-dac_override,-dac_read_search"
    return subprocess.run(
        [_SETPRIV, f"--bounding-set={caps}", sys.executable, "-m", "troupe", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
        check=False,
    )


@pytest.mark.skipif(_SETPRIV is None, reason="needs util-linux's setpriv")
def test_permission_denied_on_a_low_port(fake_engine_path: Path, tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    done = _without_privileges(
        "serve",
        "--engine",
        str(fake_engine_path),
        "--models-dir",
        str(tmp_path / "models"),
        "--port",
        "81",
        env=_env(tmp_path),
    )
    assert_one_line_error(done, "127.0.0.1:81", "permission denied")


@pytest.mark.skipif(_SETPRIV is None, reason="needs util-linux's setpriv")
def test_unreadable_preset(fake_engine_path: Path, tmp_path: Path) -> None:
    preset = tmp_path / "locked.ini"
    preset.write_text("[m]\nmodel = x.gguf\n")
    preset.chmod(0)
    done = _without_privileges(
        "serve",
        "--engine",
        str(fake_engine_path),
        "--models-preset",
        str(preset),
        env=_env(tmp_path),
    )
    assert_one_line_error(done, str(preset))


@pytest.mark.skipif(_SETPRIV is None, reason="needs util-linux's setpriv")
def test_unreadable_hugging_face_cache(fake_engine_path: Path, tmp_path: Path) -> None:
    hub = tmp_path / "hf" / "hub"
    hub.mkdir(parents=True)
    hub.chmod(0)
    (tmp_path / "models").mkdir()
    done = _without_privileges(
        "serve",
        "--engine",
        str(fake_engine_path),
        "--models-dir",
        str(tmp_path / "models"),
        env=_env(tmp_path),
    )
    hub.chmod(0o755)
    assert_one_line_error(done, "cannot read the Hugging Face cache", "permission denied")


def test_missing_config_file(fake_engine_path: Path, tmp_path: Path) -> None:
    done = _serve(fake_engine_path, tmp_path, "--config", str(tmp_path / "nope.toml"))
    assert_one_line_error(done, str(tmp_path / "nope.toml"))


def test_child_flag_the_engine_refuses(engine_path: Path, tmp_path: Path) -> None:
    """The engine's own parser judges the value, and its message is the one shown."""
    done = _serve(engine_path, tmp_path, "--ctx-size", "abc")
    assert_one_line_error(done, "the engine refuses", '"--ctx-size"', "stoi")


def test_models_with_no_catalog(engine_path: Path, tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    done = run_troupe(
        "models",
        "--engine",
        str(engine_path),
        "--models-dir",
        str(tmp_path / "empty"),
        env=_env(tmp_path),
    )
    assert_one_line_error(done, "no models")


def test_models_url_with_nothing_there(engine_path: Path, tmp_path: Path) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    for extra in ((), ("--json",)):
        done = run_troupe(
            "models", "--engine", str(engine_path), "--url", url, *extra, env=_env(tmp_path)
        )
        assert_one_line_error(done, url)
        assert done.stdout == ""  # not an empty table, not "[]"


def test_import_missing_file_names_it(tmp_path: Path) -> None:
    done = run_troupe("import", str(tmp_path / "nope.gguf"), "--models-dir", str(tmp_path / "d"))
    assert_one_line_error(done, str(tmp_path / "nope.gguf"), "no such file")
    assert "error: error:" not in done.stderr


def test_import_into_missing_dir_names_the_flag(tmp_path: Path) -> None:
    write_tiny_models(tmp_path, ["m"])
    done = run_troupe("import", str(tmp_path / "m.gguf"), "--models-dir", str(tmp_path / "d"))
    assert_one_line_error(done, f"--models-dir {tmp_path / 'd'}", "does not exist")
    assert "error: error:" not in done.stderr


def test_serve_help_mentions_config() -> None:
    done = run_troupe("serve", "--help")
    assert done.returncode == 0
    assert "--config PATH" in done.stdout
    assert "--access-log on|off" in done.stdout
