"""Time to the first SSE event through nginx: the child directly, troupe, nginx in front of
troupe with the shipped ``configs/nginx-troupe.conf``, and llama.cpp's C++ router.

Each target streams the same short ``/completion`` from its own child (same engine,
same tiny model, same arguments); runs alternate between targets so a change in
machine load hits all alike. Prints the median and p90 of the time from sending the
request to the first body byte (the first event), and what nginx adds to troupe.

    .venv/bin/python bench/nginx.py [--quick] [--runs N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _util import (
    HttpRequest,
    http_json,
    percentile,
    print_child_flags,
    start_process,
    stream_events,
)
from troupe.engine import find_engine
from troupe_rig import TinyModel, write_tiny_models
from troupe_rig.engine_process import free_port
from troupe_rig.nginx import NGINX, write_config

MODEL = TinyModel(name="bench-tiny", n_ctx=2048)
CHILD_ARGS = ["--threads", "1", "--ctx-size", str(MODEL.n_ctx)]


def _wait_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
            return
        time.sleep(0.02)
    raise RuntimeError(f"nothing listens on port {port} after {timeout:g} s")


def _warm(url: str, timeout: float = 60) -> None:
    """Until ``url`` answers (a router loads its model on the first request)."""
    body = {"model": MODEL.name, "content": "hello"}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if http_json(f"{url}/tokenize", body)[0] == 200:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not answer within {timeout:g} s")


def start(stack: contextlib.ExitStack, tmp: Path) -> dict[str, str]:
    engine, _ = find_engine()
    models = tmp / "models"
    (model,) = write_tiny_models(models, [MODEL])
    host = ["--host", "127.0.0.1", "--port", "0"]
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_SERVER_ROUTER_PORT"}
    commands = {
        "direct": [str(engine), "--model", str(model), *host, *CHILD_ARGS],
        "troupe": [sys.executable, "-m", "troupe", "serve", "--engine", str(engine),
                   "--state-dir", str(tmp / "state"), "--models-dir", str(models),
                   *host, *CHILD_ARGS],
        "C++ router": [str(engine), "--models-dir", str(models), *host, *CHILD_ARGS],
    }  # fmt: skip
    urls: dict[str, str] = {}
    for name, argv in commands.items():
        proc = start_process(name, argv, tmp, env)
        stack.callback(proc.stop, 15.0)
        urls[name] = proc.wait_listening(60)
    troupe_port = int(urls["troupe"].rsplit(":", 1)[1])
    port = free_port()
    argv = write_config(tmp / "nginx", port, troupe_port, Path(__file__).parents[1] /
                        "configs" / "nginx-troupe.conf", NGINX)  # fmt: skip
    nginx = start_process("nginx", argv, tmp, env)
    stack.callback(nginx.stop, 10.0)
    _wait_port(port, 20)
    urls["nginx + troupe"] = f"http://127.0.0.1:{port}"
    for url in urls.values():
        _warm(url)
    return urls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few runs, to see that it works")
    parser.add_argument("--runs", type=int, default=60, help="streams per target (default 60)")
    args = parser.parse_args()
    print_child_flags(CHILD_ARGS)
    runs = 5 if args.quick else args.runs
    body = {"model": MODEL.name, "prompt": "hello", "n_predict": 8, "stream": True,
            "cache_prompt": False}  # fmt: skip
    request = HttpRequest("POST", "/completion", json.dumps(body).encode())
    with (
        tempfile.TemporaryDirectory(prefix="troupe-bench-nginx-") as tmp,
        contextlib.ExitStack() as st,
    ):
        urls = start(st, Path(tmp))
        first: dict[str, list[float]] = {name: [] for name in urls}
        for _ in range(runs):
            for name, url in urls.items():
                result = stream_events(url, request)
                if result.status != 200 or result.events < 2:
                    raise RuntimeError(f"{name}: status {result.status}, {result.events} events")
                first[name].append(result.first_event_s)
    print(f"\ntime to the first SSE event, {runs} streams each (ms)")
    print(f"{'target':<16}{'median':>10}{'p90':>10}{'vs direct':>12}")
    base = statistics.median(first["direct"])
    for name, values in first.items():
        med = statistics.median(values)
        print(f"{name:<16}{med * 1e3:>10.3f}{percentile(sorted(values), 90) * 1e3:>10.3f}"
              f"{med / base:>11.2f}x")  # fmt: skip
    added = statistics.median(first["nginx + troupe"]) - statistics.median(first["troupe"])
    print(f"\nnginx adds {added * 1e3:.3f} ms (median) to troupe's first event")
    return 0


if __name__ == "__main__":
    sys.exit(main())
