"""SIGHUP on a real ``troupe serve`` process re-reads the tenants file: a key's models
change on the next request of a connection that stays open, a stream under way goes on to
its end, and a bad file is logged in one line and the old tenants kept."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import trio

from troupe_rig.process import TroupeProcess, start_troupe
from troupe_rig.router import write_preset

ALICE = "k-alice-SECRET"
FILE = '[[tenant]]\nname = "alice"\nkey = "k-alice-SECRET"\nmodels = {models}\n'


async def _models(stream: trio.SocketStream) -> bytes:
    """GET /v1/models as alice on ``stream`` (kept open): the answer's body."""
    await stream.send_all(
        b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Authorization: Bearer " + ALICE.encode() + b"\r\n\r\n"
    )
    got = b""
    with trio.fail_after(10):
        while b'"object":"list"' not in got:
            chunk = await stream.receive_some(65536)
            assert chunk, got
            got += chunk
    assert got.startswith(b"HTTP/1.1 200"), got
    return got.split(b"\r\n\r\n", 1)[1]


async def _hangup(troupe: TroupeProcess, marker: bytes) -> None:
    """SIGHUP, then the log up to ``marker`` (a line it has not written before)."""
    assert marker not in troupe.log
    troupe.process.send_signal(signal.SIGHUP)
    await troupe.read_log_until(marker)


async def test_sighup_rereads_the_tenants_file_without_dropping_a_connection(
    fake_engine_path: Path, tmp_path: Path
) -> None:
    preset = write_preset(
        tmp_path, {"a": {}, "b": {}, "slow": {"fake-tps": "20", "fake-tokens": "40"}}
    )
    tenants = tmp_path / "tenants.toml"
    tenants.write_text(FILE.format(models='["a", "slow"]'))
    troupe = await start_troupe(
        [
            "--engine",
            str(fake_engine_path),
            "--models-preset",
            str(preset),
            "--tenants",
            str(tenants),
        ],
        state_dir=tmp_path / "state",
        cwd=tmp_path,
    )
    port = int(troupe.url.rsplit(":", 1)[1])
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    assert b'"id":"b"' not in await _models(stream)
    events: list[str] = []
    async with httpx.AsyncClient(base_url=troupe.url, timeout=60) as http:
        body = {"model": "slow", "prompt": "x", "stream": True}
        headers = {"Authorization": f"Bearer {ALICE}"}
        async with http.stream("POST", "/completion", json=body, headers=headers) as resp:
            assert resp.status_code == 200
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if not events:  # mid-stream: alice may now use b too
                    tenants.write_text(FILE.format(models='["a", "b", "slow"]'))
                    await _hangup(troupe, b"tenants file read again")
                events.append(line)
    assert len(events) == 41  # 40 tokens and the final event: the stream went on
    assert '"stop":true' in events[-1]
    assert b'"id":"b"' in await _models(stream)  # the same connection, the new book

    tenants.write_text(FILE.format(models='["a"]') + "wieght = 2\n")
    await _hangup(troupe, b"tenants file kept as it was")
    line = next(ln for ln in troupe.log.splitlines() if b"tenants file kept as it was" in ln)
    assert f"{tenants}: line 5: tenant \"alice\": unknown key 'wieght'".encode() in line
    assert b"SECRET" not in troupe.log
    assert b'"id":"b"' in await _models(stream)  # the old book stays
    await stream.aclose()
    assert troupe.process.returncode is None
    troupe.process.send_signal(signal.SIGTERM)
    with trio.fail_after(30):
        assert await troupe.process.wait() == 0
