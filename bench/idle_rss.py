"""Idle memory: ``troupe serve`` vs the C++ router, both over the same two tiny models.

Each router is started as its own process over a models directory holding two tiny
GGUF files (none loaded), left to settle (troupe measures each model once at start:
its measure children must be gone, and its RSS steady for a few seconds), then read
from ``/proc/PID/status`` (VmRSS) and ``smaps_rollup`` (PSS: shared pages counted in
part). Printed side by side with the ratio troupe / C++ router; ``--rounds`` starts
both again that many times and prints each round.

    .venv/bin/python bench/idle_rss.py [--rounds N] [--settle S]
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
import time
from pathlib import Path

import psutil

from _pair import ROUTERS, start_pair
from _util import Proc
from troupe.engine import find_engine

STEADY_FOR = 3.0  # seconds without a change over 1% before a reading counts


def _status_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def _pss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1])
    return 0


def settled(proc: Proc, limit: float) -> tuple[int, int]:
    """(VmRSS, PSS) in KiB once the process has no children and a steady RSS."""
    deadline = time.monotonic() + limit
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        rss = _status_kib(proc.pid, "VmRSS")
        busy = bool(psutil.Process(proc.pid).children())
        if busy or last < 0 or abs(rss - last) > last / 100:
            last, since = rss, time.monotonic()
        elif time.monotonic() - since >= STEADY_FOR:
            return rss, _pss_kib(proc.pid)
        time.sleep(0.25)
    return _status_kib(proc.pid, "VmRSS"), _pss_kib(proc.pid)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--settle", type=float, default=60.0, help="longest wait to settle (s)")
    args = parser.parse_args()
    engine, _ = find_engine()
    print(f"{'round':>5} {'router':11} {'VmRSS MiB':>10} {'PSS MiB':>8}")
    for n in range(1, args.rounds + 1):
        with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
            pair = start_pair(stack, engine, Path(tmp))
            readings = {name: settled(pair[name][0], args.settle) for name in ROUTERS}
        for name in ROUTERS:
            rss, pss = readings[name]
            print(f"{n:>5} {name:11} {rss / 1024:>10.1f} {pss / 1024:>8.1f}")
        ours, theirs = readings["troupe"][0], readings["C++ router"][0]
        print(f"{'':5} troupe / C++ router: {ours / theirs:.2f}x VmRSS")


if __name__ == "__main__":
    main()
