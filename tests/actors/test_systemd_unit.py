"""configs/troupe.service: systemd accepts it, its stop timeout covers troupe's whole stop,
and a troupe process stopped the way the unit stops it (SIGTERM) leaves nothing behind."""

from __future__ import annotations

import configparser
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest
import trio

from troupe.catalog.entry import DEFAULT_STOP_TIMEOUT, ModelEntry
from troupe.service import HTTP_GRACE, SHUTDOWN_GRACE
from troupe.settings.router import RouterSettings
from troupe_rig.process import start_troupe
from troupe_rig.router import write_preset

UNIT = Path(__file__).resolve().parents[2] / "configs" / "troupe.service"


def service() -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read(UNIT)
    return parser["Service"]


def test_stop_timeout_covers_drain_ladders_and_grace() -> None:
    unit = service()
    term_grace = ModelEntry.__attrs_attrs__.term_grace.default  # type: ignore[attr-defined]
    # service.shutdown: waiters answered (at most SHUTDOWN_GRACE), requests in flight drain
    # (--drain-timeout, plus HTTP_GRACE for handlers to end once cut), then every child's
    # ladder in parallel (stop-timeout + term-grace, plus SHUTDOWN_GRACE before SIGKILL).
    drain = RouterSettings().drain_timeout
    ladder = DEFAULT_STOP_TIMEOUT + term_grace
    whole_stop = SHUTDOWN_GRACE + drain + HTTP_GRACE + ladder + SHUTDOWN_GRACE
    timeout = unit["TimeoutStopSec"]
    assert timeout.isdigit()
    assert int(timeout) > whole_stop
    assert unit["KillSignal"] == "SIGTERM"
    assert unit["KillMode"] == "mixed"  # troupe stops its children itself, in order


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    # The shipped paths (/srv/troupe) do not exist here: point ExecStart at this troupe.
    text = UNIT.read_text().replace(
        "/srv/troupe/.venv/bin/troupe", f"{sys.executable} -m troupe", 1
    )
    copy = tmp_path / "troupe.service"
    copy.write_text(text)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(copy)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "troupe.service" not in done.stderr, done.stderr


async def test_sigterm_stops_troupe_and_its_children_well_within_the_unit_timeout(
    fake_engine_path: Path, tmp_path: Path
) -> None:
    preset = write_preset(tmp_path, {"a": {}, "b": {}})
    troupe = await start_troupe(
        ["--engine", str(fake_engine_path), "--models-preset", str(preset)],
        state_dir=tmp_path / "state",
        cwd=tmp_path,
    )
    proc = troupe.process
    await troupe.read_log_until(b"ready: 2 models (a, b)")
    async with httpx.AsyncClient(base_url=troupe.url, timeout=30) as http:
        for model in ("a", "b"):
            body = {"model": model, "prompt": "x", "n_predict": 2}
            assert (await http.post("/completion", json=body)).status_code == 200
    children = psutil.Process(proc.pid).children(recursive=True)
    assert len(children) >= 2
    proc.send_signal(signal.SIGTERM)
    with trio.fail_after(int(service()["TimeoutStopSec"])):
        await troupe.drain_log()
        assert await proc.wait() == 0
    assert b"SIGTERM: shutting down" in troupe.log
    _gone, alive = await trio.to_thread.run_sync(lambda: psutil.wait_procs(children, timeout=5))
    assert not alive
