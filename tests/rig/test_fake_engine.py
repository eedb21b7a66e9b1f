"""The fake engine: the real engine's protocol checks, then every knob, over real processes."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import httpx
import pytest
import trio
import trio_websocket

from troupe.engine import probe_engine
from troupe.settings.options import parse_help
from troupe_rig import free_port, open_engine
from troupe_rig.checks import (
    check_child_exit_command,
    check_child_ready,
    check_child_stdin_eof,
    check_http_surface,
    read_sse,
)
from troupe_rig.fake_engine import KNOBS, help_text, load_config

LOADING_503 = {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}


@pytest.fixture
def model(tiny_model_dir: Path) -> Path:
    return tiny_model_dir / "tiny-a.gguf"


def argv(engine: Path, model: Path, *extra: str, port: int = 0) -> list[str]:
    return [str(engine), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
            "-c", "256", "--log-colors", "off", *extra]  # fmt: skip


# --- the same checks as tests/e2e/test_real_engine.py -------------------------------------


async def test_serves_like_the_real_engine(fake_engine_path: Path, model: Path) -> None:
    extra = ("-a", "tiny-a", "--totally-unknown", "value", "--unknown-flag", "-fa", "on")
    started = time.monotonic()
    async with open_engine(argv(fake_engine_path, model, *extra), child=False) as engine:
        with trio.fail_after(30):
            url = await engine.url()
        print(f"fake engine: ready {time.monotonic() - started:.2f} s after spawn")
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            await check_http_surface(client, "tiny-a")
        assert engine.states == []  # not a child: no state lines
        assert engine.stdout_lines == []
        engine.signal(signal.SIGTERM)
        with trio.fail_after(30):
            assert await engine.wait() == 0


async def test_child_reports_loading_then_ready(fake_engine_path: Path, model: Path) -> None:
    size = model.stat().st_size  # noqa: ASYNC240 (a local file, before anything runs)
    engine = await check_child_ready(argv(fake_engine_path, model, "-a", "tiny-a"), "tiny-a")
    info = engine.states[-1][1]
    assert isinstance(info, dict)
    assert info["aliases"] == ["tiny-a"]
    assert info["meta"]["size"] == size


async def test_child_exits_0_on_exit_command(fake_engine_path: Path, model: Path) -> None:
    await check_child_exit_command(argv(fake_engine_path, model))


async def test_child_exits_1_on_stdin_eof(fake_engine_path: Path, model: Path) -> None:
    await check_child_stdin_eof(argv(fake_engine_path, model))


async def test_missing_model_fails_like_the_real_engine(
    fake_engine_path: Path, tmp_path: Path
) -> None:
    async with open_engine(argv(fake_engine_path, tmp_path / "missing.gguf")) as engine:
        with trio.fail_after(30):
            assert await engine.wait() == 1
    assert [s for s, _ in engine.states] == ["loading"]
    assert "failed to open GGUF file" in engine.stderr_text


# --- command line ---------------------------------------------------------------------------


def test_help_parses_into_options_with_knobs() -> None:
    table = parse_help(help_text())
    for key, env in [("fake-load-time", "TROUPE_FAKE_LOAD_TIME"), ("fake-tps", "TROUPE_FAKE_TPS")]:
        found = table.by_key(key)
        assert found is not None
        assert (found[0].takes_value, found[0].env) == (True, env)
    oom = table.by_key("fake-oom")
    assert oom is not None
    assert not oom[0].takes_value
    assert len([o for o in table if o.spellings[0].startswith("--fake-")]) == len(KNOBS)
    for key in ("model", "alias", "port", "ctx-size", "n-gpu-layers", "sleep-idle-seconds"):
        assert table.by_key(key) is not None, key
    negated = table.by_key("no-models-autoload")
    assert negated is not None
    assert negated[1] is True


def test_knobs_read_env_and_command_line_wins() -> None:
    env = {"TROUPE_FAKE_LOAD_TIME": "2.5", "TROUPE_FAKE_IGNORE_EXIT": "1", "LLAMA_ARG_PORT": "9"}
    cfg = load_config(["--fake-load-time", "0.5", "--mystery", "x", "-ngl", "99"], env)
    assert (cfg.load_time, cfg.ignore_exit, cfg.port) == (0.5, True, 9)
    assert cfg.ignored == ("--mystery", "x")
    assert load_config(["--sleep-idle-seconds", "2"], {}).sleep_idle == 2.0
    assert load_config(["--no-models-autoload", "--fake-oom"], {}).oom is True


def test_version_is_probed_like_the_real_one(fake_engine_path: Path) -> None:
    engine = probe_engine(fake_engine_path, "test")
    assert engine.version == "0.0.0-fake (build 0, commit fake)"


# --- knobs ----------------------------------------------------------------------------------


async def test_load_time_delays_ready(fake_engine_path: Path, model: Path) -> None:
    started = time.monotonic()
    async with open_engine(argv(fake_engine_path, model, "--fake-load-time", "0.5")) as engine:
        with trio.fail_after(30):
            await engine.wait_state("ready")
    assert time.monotonic() - started >= 0.5
    assert len(engine.states) >= 4  # 0.0, progress every 200 ms, 1.0, ready


async def test_health_says_loading_until_the_gate_opens(
    fake_engine_path: Path, model: Path, tmp_path: Path
) -> None:
    port, gate = free_port(), tmp_path / "gate"
    cmd = argv(fake_engine_path, model, "--fake-load-gate", str(gate), port=port)
    async with open_engine(cmd) as engine, httpx.AsyncClient(timeout=10) as client:
        with trio.fail_after(30):
            await engine.wait_state("loading")  # sent once HTTP is up
            for path in ("/health", "/v1/models", "/completion"):
                r = await client.get(f"http://127.0.0.1:{port}{path}")
                assert (r.status_code, r.json()) == (503, LOADING_503)
            gate.touch()
            await engine.wait_state("ready")
            r = await client.get(f"http://127.0.0.1:{port}/health")
            assert r.status_code == 200


@pytest.mark.parametrize(("knob", "code", "text"), [
    (("--fake-load-crash", "3"), 3, "crashing during load with exit code 3"),
    (("--fake-oom",), 1, "cudaMalloc failed: out of memory"),
])  # fmt: skip
async def test_load_faults_exit_before_ready(
    fake_engine_path: Path, model: Path, knob: tuple[str, ...], code: int, text: str
) -> None:
    async with open_engine(argv(fake_engine_path, model, *knob)) as engine:
        with trio.fail_after(30):
            assert await engine.wait() == code
    assert "ready" not in [s for s, _ in engine.states]
    assert text in engine.stderr_text
    if knob == ("--fake-oom",):
        assert "failed to allocate CUDA0 buffer of size" in engine.stderr_text


async def test_crash_mid_stream_truncates_and_exits_with_code(
    fake_engine_path: Path, model: Path
) -> None:
    cmd = argv(fake_engine_path, model, "--fake-crash-after", "3", "--fake-crash-code", "7")
    async with open_engine(cmd) as engine:
        with trio.fail_after(30):
            await engine.wait_state("ready")
            url = await engine.url()
            events: list[str] = []
            request = {"prompt": "hi", "n_predict": 10, "stream": True}

            async def read_stream() -> None:
                async with client.stream("POST", "/v1/completions", json=request) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data: "):
                            events.append(line)

            async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                with pytest.raises(httpx.RemoteProtocolError):  # the chunked body never ends
                    await read_stream()
            assert await engine.wait() == 7
    assert len(events) == 3, events
    assert "[DONE]" not in "".join(events)


async def test_ignore_exit_and_sigterm_until_sigkill(fake_engine_path: Path, model: Path) -> None:
    cmd = argv(fake_engine_path, model, "--fake-ignore-exit", "--fake-ignore-sigterm")
    async with open_engine(cmd) as engine, httpx.AsyncClient(timeout=10) as client:
        with trio.fail_after(30):
            await engine.wait_state("ready")
            url = await engine.url()
            await engine.send_exit()
            await engine.wait_log("ignoring the exit command")
            engine.signal(signal.SIGTERM)
            await engine.wait_log("ignoring SIGTERM")
            assert (await client.get(f"{url}/health")).status_code == 200
            assert engine.returncode is None
            engine.signal(signal.SIGKILL)
            assert await engine.wait() == -signal.SIGKILL


async def test_tokens_per_second_and_default_token_count(
    fake_engine_path: Path, model: Path
) -> None:
    cmd = argv(fake_engine_path, model, "--fake-tps", "20", "--fake-tokens", "5")
    async with open_engine(cmd, child=False) as engine:
        with trio.fail_after(30):
            url = await engine.url()
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            started = time.monotonic()
            request = {"prompt": "x", "stream": True}
            async with client.stream("POST", "/completion", json=request) as response:
                events = await read_sse(response)
            elapsed = time.monotonic() - started
    final = json.loads(events[-1])
    assert (final["stop"], final["tokens_predicted"]) == (True, 5)
    assert len(events) == 6  # five tokens and the final summary; /completion sends no [DONE]
    assert elapsed >= 5 / 20 * 0.9, elapsed


async def test_sleeps_when_idle_and_wakes_on_request(fake_engine_path: Path, model: Path) -> None:
    async with open_engine(argv(fake_engine_path, model, "--fake-sleep-idle", "0.3")) as engine:
        with trio.fail_after(30):
            await engine.wait_state("ready")
            url = await engine.url()
            await engine.wait_state("sleeping")
            asleep_at = len(engine.states)
            async with httpx.AsyncClient(base_url=url, timeout=10) as client:
                assert (await client.get("/props")).json()["is_sleeping"] is True
                assert (await client.get("/health")).status_code == 200  # does not wake it
                assert len(engine.states) == asleep_at
                r = await client.post("/completion", json={"prompt": "x", "n_predict": 2})
                assert r.json()["tokens_predicted"] == 2
            assert await engine.wait_state("ready", asleep_at) == {}  # wake: ready with {}
    kinds = [s for s, _ in engine.states[asleep_at - 1 :]]
    assert kinds[:2] == ["sleeping", "loading"], kinds
    assert "ready" in kinds


async def test_api_key(fake_engine_path: Path, model: Path) -> None:
    async with open_engine(argv(fake_engine_path, model, "--api-key", "k1"), child=False) as eng:
        with trio.fail_after(30):
            url = await eng.url()
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            assert (await client.get("/health")).status_code == 200
            assert (await client.get("/v1/models")).status_code == 401
            auth = {"Authorization": "Bearer k1"}
            assert (await client.get("/v1/models", headers=auth)).status_code == 200


async def test_a_websocket_upgrade_is_a_404_as_llama_server_has_no_websocket_route(
    fake_engine_path: Path, model: Path
) -> None:
    async with open_engine(argv(fake_engine_path, model), child=False) as engine:
        with trio.fail_after(30):
            port = int((await engine.url()).rsplit(":", 1)[1])
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            rejected: list[trio_websocket.ConnectionRejected] = []
            async with stream:
                try:
                    async with trio.open_nursery() as nursery:
                        await trio_websocket.wrap_client_stream(
                            nursery, stream, "127.0.0.1", "/v1/realtime"
                        )
                except* trio_websocket.ConnectionRejected as group:
                    rejected += group.exceptions  # type: ignore[arg-type]
        assert [r.status_code for r in rejected] == [404]
        assert json.loads(rejected[0].body or b"")["error"]["message"] == "File Not Found"
