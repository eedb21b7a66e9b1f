"""A 100 MB JSON body must not stall anyone else: another client's ``GET /health``
latency while one keyed client posts a body of small numbers.

``troupe serve`` (the real engine, tiny models, ``--api-key``) gets one ``POST
/v1/chat/completions`` whose body is ``{"messages": [...], "pad": [0,1,2,...],
"model": ...}`` (the ``model`` key last, so it is found only past the 100 MB), while a
second client sends ``GET /health`` on one keep-alive connection back to back. Two
cases: a model that does not exist (troupe scans the body, answers 400: its own cost
alone) and a real one (the body also goes to the child, which parses it on the same
cores). Printed per case: how long the big request took, and the /health latencies
during it (count, p50, p99, max) beside a baseline measured just before.

    .venv/bin/python bench/big_body.py [--mib 100] [--model-case missing,real]

Run it against an older troupe with ``PYTHONPATH=<its src>`` to compare (the child
``troupe serve`` is started with this interpreter and that environment).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

from _util import percentile, serving
from troupe.engine import find_engine
from troupe_rig import write_tiny_models

KEY = "bench-key"


def big_body(mib: int, model: str) -> bytes:
    count = (mib << 20) // 2  # "1," per number
    digits = b"1," * (count - 1) + b"1"
    head = b'{"messages":[{"role":"user","content":"hi"}],"max_tokens":1,"pad":['
    return head + digits + b'],"model":"' + model.encode() + b'"}'


def health_latencies(host: str, port: int, stop: threading.Event, limit: float) -> list[float]:
    """``GET /health`` back to back on one connection until ``stop`` (or ``limit`` s)."""
    conn = http.client.HTTPConnection(host, port, timeout=60)
    out: list[float] = []
    end = time.perf_counter() + limit
    while not stop.is_set() and time.perf_counter() < end:
        started = time.perf_counter()
        conn.request("GET", "/health")
        resp = conn.getresponse()
        resp.read()
        out.append(time.perf_counter() - started)
        if resp.status != 200:
            raise RuntimeError(f"/health answered {resp.status}")
    conn.close()
    return out


def post(host: str, port: int, body: bytes, result: dict[str, object]) -> None:
    conn = http.client.HTTPConnection(host, port, timeout=600)
    started = time.perf_counter()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
    conn.request("POST", "/v1/chat/completions", body=body, headers=headers)
    resp = conn.getresponse()
    answer = resp.read()
    result["status"] = resp.status
    result["seconds"] = time.perf_counter() - started
    result["answer"] = answer[:160]
    conn.close()


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    ms = [1e3 * percentile(ordered, p) for p in (50, 99)]
    worst = ordered[-1] * 1e3
    return f"n={len(values):5d} p50={ms[0]:6.2f} ms p99={ms[1]:7.2f} ms max={worst:7.2f} ms"


def run_case(host: str, port: int, body: bytes, label: str) -> None:
    baseline = health_latencies(host, port, threading.Event(), 2.0)
    stop = threading.Event()
    result: dict[str, object] = {}

    def big() -> None:
        try:
            post(host, port, body, result)
        finally:
            stop.set()

    thread = threading.Thread(target=big)
    thread.start()
    during = health_latencies(host, port, stop, 600.0)
    thread.join()
    print(f"{label}: POST {len(body) / (1 << 20):.0f} MiB -> {result.get('status')} in "
          f"{float(result.get('seconds', 0.0)):.2f} s  {result.get('answer')!r}")  # fmt: skip
    print(f"  /health before: {summary(baseline)}")
    print(f"  /health during: {summary(during)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--model-case", default="missing,real")
    args = parser.parse_args()
    engine, _ = find_engine()
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        models = Path(tmp) / "models"
        write_tiny_models(models, 1)
        argv = [sys.executable, "-m", "troupe", "serve", "--engine", str(engine),
                "--state-dir", str(Path(tmp) / "state"), "--models-dir", str(models),
                "--host", "127.0.0.1", "--port", "0", "--api-key", KEY,
                "--max-body-mib", str(args.mib + 16)]  # fmt: skip
        url = stack.enter_context(serving("troupe", argv, Path(tmp)))
        host, port = url.removeprefix("http://").rsplit(":", 1)
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, troupe from "
              f"{os.environ.get('PYTHONPATH') or 'this checkout'}")  # fmt: skip
        for case in args.model_case.split(","):
            model = "no-such-model" if case == "missing" else "tiny-a"
            run_case(host, int(port), big_body(args.mib, model), f"model {case} ({model})")


if __name__ == "__main__":
    main()
