"""troupe's downloader against huggingface_hub and llama.cpp's, on the loopback hub.

For one LFS file of ``--size`` MiB served by `troupe_rig.hub` on loopback:

* throughput: a fresh download, unthrottled (MiB/s);
* cancel latency: the hub throttled to ``--rate`` MiB/s, the download cancelled after
  one second; the time until the download has really stopped (for huggingface_hub,
  which has no cancel, a progress hook that raises: the thread stops at its next
  10 MiB chunk);
* resume after a dropped connection: the hub cuts the first response halfway; bytes
  the hub had to send, as a multiple of the file size (1.00 = nothing fetched twice);
* resume after a restart: a download cancelled halfway, then a new one; bytes sent
  over both, as a multiple of the file size.

llama.cpp's column runs ``llama-server -hf`` (its downloader, timed until the blob is
complete) for throughput and the dropped connection, when the engine is installed.

Then, as a user sees it: each router (troupe, and llama.cpp's C++ router) downloads the
file through ``POST /models`` from the throttled hub, and ``POST /models/unload`` is
timed until it answers (both answer once the download has really stopped).

    .venv/bin/python bench/downloads.py [--size MiB] [--rate MiB/s] [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import huggingface_hub
import trio
from huggingface_hub import file_download

from _util import http_json, start_process
from troupe.download.hubapi import HubClient, open_client
from troupe.download.job import DownloadJob
from troupe.engine import find_engine
from troupe.errors import EngineNotFound
from troupe_rig.hub import Fault, Hub, open_hub
from troupe_rig.reaper import guard

MiB = 1 << 20
REPO, FILE = "bench/big", "big-Q8_0.gguf"


class _Cancelled(Exception):
    pass


# ----- troupe -----------------------------------------------------------------------------


async def troupe_download(hub: Hub, cache: Path, cancel_after: float | None = None) -> float:
    """Seconds from the cancel to the job's return (cancel_after), else the whole time."""
    async with open_client() as client:
        plan = await HubClient(client, hub.url).plan(REPO)
        job = DownloadJob(plan, cache, client, hub.url)
        began = time.monotonic()
        if cancel_after is None:
            await job.run()
            return time.monotonic() - began
        cancelled_at = 0.0
        async with trio.open_nursery() as nursery:
            nursery.start_soon(job.run)
            await trio.sleep(cancel_after)
            cancelled_at = time.monotonic()
            nursery.cancel_scope.cancel()
        return time.monotonic() - cancelled_at


def troupe_sync(hub: Hub, cache: Path, cancel_after: float | None = None) -> float:
    return trio.run(troupe_download, hub, cache, cancel_after)


# ----- huggingface_hub ----------------------------------------------------------------------


def hf_download(hub: Hub, cache: Path, cancel_after: float | None = None) -> float:
    stop = threading.Event()

    class Hook(huggingface_hub.utils.tqdm):  # type: ignore[misc,name-defined]
        def update(self, n: float | None = 1) -> bool | None:
            if stop.is_set():
                raise _Cancelled
            return super().update(n)  # type: ignore[no-any-return]

    def run() -> None:
        with contextlib.suppress(_Cancelled):
            huggingface_hub.hf_hub_download(
                REPO, FILE, cache_dir=cache, endpoint=hub.url.rstrip("/"), tqdm_class=Hook
            )

    began = time.monotonic()
    if cancel_after is None:
        run()
        return time.monotonic() - began
    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(cancel_after)
    cancelled_at = time.monotonic()
    stop.set()
    thread.join()
    return time.monotonic() - cancelled_at


# ----- llama.cpp ---------------------------------------------------------------------------


def llama_download(hub: Hub, cache: Path, engine: Path, blob: str) -> float:
    env = dict(os.environ, MODEL_ENDPOINT=hub.url, LLAMA_CACHE=str(cache))
    target = cache / "models--bench--big" / "blobs" / blob
    began = time.monotonic()
    with subprocess.Popen(
        [str(engine), "-hf", f"{REPO}:Q8_0", "--port", "0"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    ) as proc:
        guard(proc.pid)  # killed if the bench is
        try:
            while not target.exists():
                if proc.poll() is not None:
                    raise RuntimeError(f"llama-server exited ({proc.returncode}) before the blob")
                time.sleep(0.005)
            return time.monotonic() - began
        finally:
            proc.kill()


# ----- through a router ---------------------------------------------------------------------


def router_unload_ms(hub: Hub, root: Path, argv: list[str], name: str, rate: float) -> float:
    """POST /models, let it run a second, then the time ``POST /models/unload`` takes."""
    cache = fresh(root, name.replace(" ", "-") + "-cache")
    env = dict(os.environ, MODEL_ENDPOINT=hub.url, LLAMA_CACHE=str(cache))
    env["TROUPE_STATE_DIR"] = str(fresh(root, "state"))
    hub.rate = rate * MiB
    proc = start_process(name, argv, root, env)
    try:
        url = proc.wait_listening(60)
        status, body = http_json(url + "/models", {"model": f"{REPO}:Q8_0"})
        assert status == 200, body
        time.sleep(1.0)
        began = time.monotonic()
        status, body = http_json(url + "/models/unload", {"model": f"{REPO}:Q8_0"})
        took = time.monotonic() - began
        assert status == 200, body
        return 1000 * took
    finally:
        proc.stop(10)
        hub.rate = None


def routers(hub: Hub, root: Path, rate: float, engine: Path | None) -> dict[str, float]:
    out = {}
    troupe_argv = [sys.executable, "-m", "troupe", "serve", "--port", "0"]
    if engine is not None:
        troupe_argv += ["--engine", str(engine)]
        out["llama.cpp router"] = router_unload_ms(
            hub, root, [str(engine), "--port", "0"], "llama.cpp router", rate
        )
    out["troupe"] = router_unload_ms(hub, root, troupe_argv, "troupe", rate)
    return out


# ----- the runs ---------------------------------------------------------------------------


def fresh(root: Path, name: str) -> Path:
    path = root / name
    shutil.rmtree(path, ignore_errors=True)
    return path


def measure(hub: Hub, root: Path, size: int, rate: float, engine: Path | None) -> dict[str, Any]:
    blob = next(iter(hub.repos[REPO].files.values()))
    results: dict[str, dict[str, float | str]] = {"troupe": {}, "huggingface_hub": {}}
    runners: dict[str, Any] = {"troupe": troupe_sync, "huggingface_hub": hf_download}
    for name, run in runners.items():
        r = results[name]
        hub.rate = None
        hub.fault(REPO, FILE, None)
        r["throughput MiB/s"] = size / MiB / run(hub, fresh(root, name))
        hub.rate = rate * MiB
        r["cancel latency ms"] = 1000 * run(hub, fresh(root, name), 1.0)
        hub.rate = None
        hub.fault(REPO, FILE, Fault(drop_at=size // 2))
        hub.wait_idle()
        before = hub.sent(FILE)
        run(hub, fresh(root, name))
        hub.wait_idle()
        r["bytes after a drop x"] = (hub.sent(FILE) - before) / size
        hub.fault(REPO, FILE, None)
        hub.rate = rate * MiB
        hub.wait_idle()
        before = hub.sent(FILE)
        cache = fresh(root, name)
        run(hub, cache, size / 2 / (rate * MiB))  # cancelled about halfway
        hub.rate = None
        run(hub, cache)
        hub.wait_idle()
        r["bytes after a restart x"] = (hub.sent(FILE) - before) / size
    if engine is not None:
        import hashlib  # noqa: PLC0415

        sha = hashlib.sha256(blob).hexdigest()
        r = results["llama.cpp"] = {}
        hub.rate = None
        hub.fault(REPO, FILE, None)
        r["throughput MiB/s"] = size / MiB / llama_download(hub, fresh(root, "llama"), engine, sha)
        hub.fault(REPO, FILE, Fault(drop_at=size // 2))
        hub.wait_idle()
        before = hub.sent(FILE)
        llama_download(hub, fresh(root, "llama"), engine, sha)
        hub.wait_idle()
        r["bytes after a drop x"] = (hub.sent(FILE) - before) / size
        r["cancel latency ms"] = r["bytes after a restart x"] = "-"
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=256, help="file size in MiB")
    parser.add_argument("--rate", type=float, default=4.0, help="throttled rate, MiB/s")
    parser.add_argument("--quick", action="store_true", help="16 MiB, to see that it runs")
    ns = parser.parse_args()
    size = (16 if ns.quick else ns.size) * MiB
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    file_download.logger.setLevel("ERROR")  # its "Trying to resume" warnings
    try:
        engine: Path | None = find_engine()[0]
    except EngineNotFound:
        engine = None
    with tempfile.TemporaryDirectory() as tmp, open_hub() as hub:
        hub.add_repo(REPO, {FILE: os.urandom(size)})
        results = measure(hub, Path(tmp), size, ns.rate, engine)
        unloads = routers(hub, Path(tmp), ns.rate, engine)
    metrics = list(next(iter(results.values())))
    print(f"file {size // MiB} MiB on loopback; throttled runs at {ns.rate:g} MiB/s")
    print(f"{'':26}" + "".join(f"{name:>18}" for name in results))
    for metric in metrics:
        cells = []
        for r in results.values():
            v = r.get(metric, "-")
            cells.append(f"{v:>18.2f}" if isinstance(v, float) else f"{v:>18}")
        print(f"{metric:26}" + "".join(cells))
    print("POST /models/unload during a download, until it answers:")
    for name, ms in unloads.items():
        print(f"  {name:24}{ms:10.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
