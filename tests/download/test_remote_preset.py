"""``troupe serve -hf org/repo``: a repo with ``preset.ini`` at its root makes troupe a
router over that preset (as upstream); any other repo is a model the engine runs itself."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

from troupe_rig.hub import Hub
from troupe_rig.process import start_troupe


@pytest.fixture
def hub_env(hub: Hub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The loopback hub as the endpoint and a fresh cache, for troupe processes."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.setenv("MODEL_ENDPOINT", hub.url)
    monkeypatch.setenv("LLAMA_CACHE", str(tmp_path / "cache"))
    return dict(os.environ)


@pytest.mark.engine
async def test_a_preset_repo_runs_troupes_router_over_it(
    hub: Hub, hub_env: dict[str, str], engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    preset = f"[tiny]\nmodel = {tiny_model_dir / 'tiny-a.gguf'}\nctx-size = 256\n"
    hub.add_repo("org/presets", {"preset.ini": preset.encode(), "README.md": b"presets\n"})
    troupe = await start_troupe(
        ["--engine", str(engine_path), "-hf", "org/presets"], state_dir=tmp_path / "state"
    )
    proc = troupe.process
    try:
        assert b"NOTE: using preset.ini from HF repo 'org/presets'" in troupe.log
        assert b"please only use presets that you can trust!" in troupe.log
        async with trio.open_nursery() as nursery:
            nursery.start_soon(troupe.drain_log)
            async with httpx.AsyncClient(base_url=troupe.url, timeout=60) as http:
                props = (await http.get("/props")).json()
                assert props["role"] == "router"
                ids = [m["id"] for m in (await http.get("/models")).json()["data"]]
                assert ids == ["tiny"]
                resp = await http.post(
                    "/completion", json={"model": "tiny", "prompt": "hello", "n_predict": 4}
                )
                assert resp.status_code == 200, resp.text
                assert resp.json()["tokens_predicted"] == 4
            nursery.cancel_scope.cancel()
        (ini,) = (tmp_path / "cache" / "models--org--presets" / "snapshots").glob("*/preset.ini")
        assert ini.read_text() == preset  # through the cache, verified (git blob id)
        assert [g.path for g in hub.gets("preset.ini")] == [
            f"/org/presets/resolve/{hub.repos['org/presets'].commit}/preset.ini"
        ]
    finally:
        proc.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            assert await proc.wait() == 0


def test_a_model_repo_is_run_by_the_engine_itself(
    hub: Hub, hub_env: dict[str, str], fake_engine_path: Path, tiny_files: dict[str, Path]
) -> None:
    hub.add_repo("org/tiny", {"m-Q4_K_M.gguf": tiny_files["m-Q4_K_M.gguf"]})
    argv = ["serve", "--engine", str(fake_engine_path), "-hf", "org/tiny", "--version"]
    done = subprocess.run(
        [sys.executable, "-m", "troupe", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        env=hub_env,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "fake" in done.stdout + done.stderr  # the engine ran, with troupe's arguments
    assert next(r.path for r in hub.requests if r.method == "GET") == "/api/models/org/tiny/refs"
    assert not list(Path(hub_env["LLAMA_CACHE"]).glob("models--org--tiny/snapshots/*/*"))


async def test_offline_the_cached_preset_is_used(
    hub: Hub, hub_env: dict[str, str], fake_engine_path: Path, tmp_path: Path
) -> None:
    preset = "[one]\nmodel = one.gguf\n"
    (tmp_path / "one.gguf").touch()  # the fake engine only checks that it exists
    hub.add_repo("org/presets", {"preset.ini": preset.encode()})
    pulled = await trio.run_process(
        [sys.executable, "-m", "troupe", "pull", "org/presets"],
        capture_stdout=True,
        capture_stderr=True,
        env={**hub_env, "TROUPE_STATE_DIR": str(tmp_path / "state")},
        check=False,
    )
    assert pulled.returncode == 0, pulled.stderr.decode()
    asked = len(hub.requests)
    troupe = await start_troupe(
        ["--engine", str(fake_engine_path), "-hf", "org/presets", "--offline"],
        state_dir=tmp_path / "state",
        cwd=tmp_path,
    )
    try:
        async with httpx.AsyncClient(base_url=troupe.url, timeout=30) as http:
            ids = [m["id"] for m in (await http.get("/models")).json()["data"]]
        assert ids == ["one"]
        assert len(hub.requests) == asked  # offline: the hub was not asked
    finally:
        troupe.process.send_signal(signal.SIGTERM)
        with trio.fail_after(30):
            await troupe.process.wait()
