"""The real llama-server with a tiny GGUF written by the suite.

These are the reference behaviours the fake engine copies: the same checks run
against the fake in tests/rig/test_fake_engine.py.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import trio

from troupe.settings.options import parse_help
from troupe_rig import open_engine
from troupe_rig.checks import (
    check_child_exit_command,
    check_child_ready,
    check_child_stdin_eof,
    check_http_surface,
)
from troupe_rig.fake_engine import KNOBS, help_text
from troupe_rig.fake_engine.options import OPTIONS

pytestmark = pytest.mark.engine


def _argv(engine: Path, model: Path, *extra: str) -> list[str]:
    return [str(engine), "-m", str(model), "--host", "127.0.0.1", "--port", "0", "-c", "256",
            "--log-colors", "off", *extra]  # fmt: skip


async def test_serves_completion_tokenize_and_chat_stream(
    engine_path: Path, tiny_model_dir: Path
) -> None:
    model = tiny_model_dir / "tiny-a.gguf"
    started = time.monotonic()
    async with open_engine(_argv(engine_path, model, "-a", "tiny-a"), child=False) as engine:
        with trio.fail_after(30):
            url = await engine.url()
        print(f"real engine: tiny model ready in {time.monotonic() - started:.2f} s")
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            info = (await client.get("/v1/models")).json()["data"][0]
            await check_http_surface(client, "tiny-a")
        assert info["meta"]["n_vocab"] == 294
        assert info["meta"]["n_ctx_train"] == 512
        assert engine.states == []  # not a child: no state lines
        engine.signal(15)
        with trio.move_on_after(10):
            assert await engine.wait() == 0  # a graceful stop
        if engine.returncode is None:
            # Seen once on a loaded machine: the graceful stop hung after an SSE stream. A
            # second SIGTERM exits at once ("terminating immediately"), which the stop
            # ladder relies on; troupe's nudge is the first, its SIGTERM stage the second.
            engine.signal(15)
            with trio.fail_after(10):
                # exit(1), or an abort from a thread still running as it terminates
                assert await engine.wait() in (1, -signal.SIGABRT)


async def test_child_reports_loading_then_ready(engine_path: Path, tiny_model_dir: Path) -> None:
    argv = _argv(engine_path, tiny_model_dir / "tiny-b.gguf", "--alias", "tiny-b")
    engine = await check_child_ready(argv, "tiny-b")
    info = engine.states[-1][1]
    assert isinstance(info, dict)
    assert info["aliases"] == ["tiny-b"]


async def test_child_exits_0_on_exit_command(engine_path: Path, tiny_model_dir: Path) -> None:
    await check_child_exit_command(_argv(engine_path, tiny_model_dir / "tiny-a.gguf"))


async def test_child_exits_1_on_stdin_eof(engine_path: Path, tiny_model_dir: Path) -> None:
    await check_child_stdin_eof(_argv(engine_path, tiny_model_dir / "tiny-a.gguf"))


def test_fake_help_copies_the_real_help_verbatim(engine_path: Path) -> None:
    real = subprocess.run(
        [str(engine_path), "--help"], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    for opt in OPTIONS:
        assert opt.to_string() in real, f"the fake's help for {opt.args} differs from the real one"
    real_table, fake_table = parse_help(real), parse_help(help_text())
    knob_names = {k.args[0] for k in KNOBS}
    for option in fake_table:
        if option.spellings[0] in knob_names:
            continue
        found = real_table.by_spelling(option.spellings[0])
        assert found is not None, option
        assert found[0] == option


def test_version_format(engine_path: Path, fake_engine_path: Path) -> None:
    pattern = re.compile(r"^version: \S+ \(build \d+, commit \S+\)$", re.MULTILINE)
    for exe in (engine_path, fake_engine_path):
        done = subprocess.run(
            [str(exe), "--version"], capture_output=True, text=True, check=True, timeout=30
        )
        assert done.stdout == "", exe  # both print their build info on stderr
        assert pattern.search(done.stderr), done.stderr
