"""A process holding the rig, SIGKILLed, leaves nothing running (troupe_rig.reaper):
``troupe serve`` with a loaded and a loading child, an in-process router with the same,
nginx, and a bare engine, every one of them a descendant of a pytest-like parent that
gets no chance to clean up. Read from /proc: pid and start time, so a reused pid is
never taken for a survivor."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from troupe_rig import write_fake_engine

PARENT = r"""
import sys
from pathlib import Path

import httpx
import trio

from troupe.sched import Status
from troupe_rig import fake_engine_argv
from troupe_rig.engine_process import open_engine
from troupe_rig.nginx import open_nginx
from troupe_rig.process import start_troupe
from troupe_rig.router import open_router, write_preset

tmp, engine, nginx = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
SECTIONS = {
    "a": {},
    # never loads (its gate is never made): a child still loading when its owner dies
    "b": {"fake-load-time": "600", "fake-load-gate": str(tmp / "gate")},
}


async def main() -> None:
    served = tmp / "served"
    served.mkdir()
    serve_preset = write_preset(served, SECTIONS)
    troupe = await start_troupe(
        ["--engine", str(engine), "--models-preset", str(serve_preset)],
        state_dir=tmp / "serve-state",
    )
    inside = tmp / "inside"
    inside.mkdir()
    preset = write_preset(inside, SECTIONS)
    async with (
        trio.open_nursery() as nursery,
        open_router(
            ["--models-preset", str(preset)], engine=engine, state_dir=tmp / "state", cwd=tmp
        ) as router,
        httpx.AsyncClient(base_url=troupe.url, timeout=60) as http,
        open_nginx(tmp / "nginx", int(router.url.rsplit(":", 1)[1]), binary=nginx),
        open_engine([*fake_engine_argv(), "--port", "0"], child=False) as bare,
    ):
        nursery.start_soon(troupe.drain_log)
        await bare.url()
        for model in ("a", "b"):
            assert (await http.post("/models/load", json={"model": model})).status_code == 200
            await router.ctx.scheduler.load(model)
        await router.wait_for_status("a", Status.LOADED)
        await router.ctx.scheduler.wait_until(lambda s: s.models["b"].pid != 0)
        with trio.fail_after(60):
            while True:
                listed = {m["id"]: m for m in (await http.get("/models")).json()["data"]}
                if listed["a"]["status"]["value"] == "loaded" and listed["b"]["troupe"]["pid"]:
                    break
                await trio.sleep(0.05)
        print("ready", flush=True)
        await trio.sleep_forever()


trio.run(main)
"""


def _start_time(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return int(stat[stat.rindex(b")") + 2 :].split()[19])


def _running(pid: int, started: int) -> bool:
    """The same process (pid and start time), and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    rest = stat[stat.rindex(b")") + 2 :].split()
    return int(rest[19]) == started and rest[0] != b"Z"


def _descendants(root: int) -> dict[int, int]:
    """Every live descendant of ``root``: pid -> start time."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_bytes()
            except OSError:
                continue
            parents[int(entry)] = int(stat[stat.rindex(b")") + 2 :].split()[1])
    found: dict[int, int] = {}
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in found:
                started = _start_time(child)
                if started is not None:
                    found[child] = started
                    frontier.append(child)
    return found


def _describe(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
    except OSError:
        return "?"


def _engines(names: dict[int, str], engine: Path) -> list[str]:
    return [n for n in names.values() if "fake_engine" in n or str(engine) in n]


def test_a_sigkilled_parent_leaves_no_process_of_its_rig(tmp_path: Path, nginx_path: Path) -> None:
    engine = write_fake_engine(tmp_path / "bin")
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    log = tmp_path / "parent.log"
    with (
        log.open("wb") as err,
        subprocess.Popen(
            [sys.executable, str(script), str(tmp_path), str(engine), str(nginx_path)],
            stdout=subprocess.PIPE,
            stderr=err,
            start_new_session=True,  # as a CI job's pytest: its own group, killed alone here
        ) as parent,
    ):
        try:
            assert parent.stdout is not None
            line = parent.stdout.readline()  # the parent's own bounds end a hung start
            assert line == b"ready\n", log.read_text()[-3000:]
            # The children may be mid-restart (a CPU re-plan as b joined a): the five
            # engines are all there within a bound, each after its own exec.
            deadline = time.monotonic() + 30
            while True:
                rig = _descendants(parent.pid)
                names = {pid: _describe(pid) for pid in rig}
                if len(_engines(names, engine)) == 5 or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
        finally:
            os.kill(parent.pid, signal.SIGKILL)  # no finally, no atexit: gone
            parent.wait()
    joined = " ".join(names.values())
    for what in ("troupe serve", "nginx", "fake_engine", "troupe_rig.reaper"):
        assert what in joined, names  # what the parent held, there to be left behind
    # troupe serve's two children, the router's two, and the bare engine.
    assert len(_engines(names, engine)) == 5, list(names.values())
    deadline = time.monotonic() + 60  # SIGTERM, a 10 s grace for troupe serve, SIGKILL
    while (left := [p for p, s in rig.items() if _running(p, s)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert left == [], {pid: names[pid] for pid in left}
