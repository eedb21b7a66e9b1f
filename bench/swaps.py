"""Swaps: troupe vs llama-server's own (C++) router vs a child started directly.

Three tiny GGUF models, the real engine, ``-c 256``, the same request sequence
through both routers, each a separate process:

* **single swap** at ``--models-max 1``: requests alternate between two models, so
  every request unloads one and loads the other; its latency is the swap. Beside it,
  what a swap cannot avoid: a child's cold start to its first answer (started
  directly) and a child's own exit after the exit command (no connection open).
* **cold swap behind a busy model** at ``--models-max 1``: a bigger model whose file is
  not in the page cache is asked for while the loaded one serves a burst; from the
  burst's last answer to the big model's answer (its load and one request). troupe reads
  the waiting model's file ahead meanwhile; the C++ router reads it when the child loads.
* **mixed trace** at ``--models-max 2``: three models of skewed popularity (a rare one
  among two popular ones), concurrent clients sending the same seeded sequence; total
  time, p50/p99 latency and the number of loads (``model_status`` events on
  ``/models/sse``).

It prints the figures side by side and the ratios troupe / C++ router. The two routers
take turns, ``--rounds`` times (each round starts each router afresh): this machine's
speed drifts by a millisecond or two over a run, more than a swap's difference, and in
turns the drift falls on both alike. The trace's figures are the medians over the rounds
(each round's are printed too).

    .venv/bin/python bench/swaps.py [--quick] [--rounds N] [--swaps N] [--requests N]
        [--child-threads N]

Every child runs with the engine's default flags but ``-c 256 --parallel 2``: the C++
router's children then share every core (each takes them all), troupe's are placed
(`troupe.sched.placement`). ``--child-threads 1`` is the hand-tuned setting that hides
the difference.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from _util import http_json, percentile, serving
from troupe.engine import find_engine
from troupe_rig import TinyModel, write_tiny_models
from troupe_rig.engine_process import free_port
from troupe_rig.pagecache import drop_pages, resident_fraction
from troupe_rig.reaper import guard

MODELS = [TinyModel(name=n, seed=i, n_ctx=256) for i, n in enumerate(("m-a", "m-b", "m-c"))]
BIG = TinyModel(name="m-big", seed=9, n_layer=16, n_embd=512, n_ctx=256)  # about 126 MB
BURST = 8  # requests of 200 tokens that keep m-a busy while m-big waits
# The engine's defaults for everything else (threads: every core), as users run it;
# --child-threads adds one --threads to every child (and says so in the figures).
CHILD_ARGS = ["--ctx-size", "256", "--parallel", "2"]
WEIGHTS = (0.55, 0.40, 0.05)  # m-c is the rare model
EXIT_COMMAND = b"cmd_router_to_child:exit\n"


@dataclass
class TraceResult:
    seconds: float
    latencies: list[float] = field(default_factory=list)
    failures: int = 0
    loads: int = 0


def completion(model: str, tokens: int = 4) -> dict[str, object]:
    return {"model": model, "prompt": "hello", "n_predict": tokens}


def ask(url: str, model: str, tokens: int = 4) -> tuple[int, float]:
    start = time.perf_counter()
    status, _ = http_json(f"{url}/completion", completion(model, tokens), timeout=300)
    return status, time.perf_counter() - start


# --- routers ----------------------------------------------------------------------------------


@contextlib.contextmanager
def router(kind: str, engine: Path, tmp: Path, models_max: int) -> Iterator[str]:
    models_dir = tmp / "models"
    host = ["--host", "127.0.0.1", "--port", "0", "--models-dir", str(models_dir)]
    limit = ["--models-max", str(models_max)]
    if kind == "troupe":
        level = os.environ.get("BENCH_LOG_LEVEL", "warning")
        argv = [sys.executable, "-m", "troupe", "serve", "--engine", str(engine),
                "--state-dir", str(tmp / f"state-{models_max}"), "--log-level", level,
                *host, *limit, *CHILD_ARGS]  # fmt: skip
    else:
        argv = [str(engine), *host, *limit, *CHILD_ARGS]
    with serving(f"{kind}-{models_max}", argv, tmp) as url:
        yield url


class LoadCounter:
    """Counts ``model_status`` (a load started) on ``/models/sse`` in a thread."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.sock = socket.create_connection((parts.hostname, parts.port))
        self.sock.sendall(f"GET /models/sse HTTP/1.1\r\nHost: {parts.netloc}\r\n\r\n".encode())
        self.loads = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        self._ready.wait(5)

    def _read(self) -> None:
        buf = b""
        while True:
            try:
                data = self.sock.recv(65536)
            except OSError:
                return
            if not data:
                return
            buf += data
            if b"\r\n\r\n" in buf:
                self._ready.set()
            self.loads += data.count(b'"event":"model_status"')

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self._thread.join(5)


# --- measurements -----------------------------------------------------------------------------


def single_swaps(url: str, swaps: int) -> list[float]:
    names = [m.name for m in MODELS[:2]]
    status, _ = ask(url, names[0])
    assert status == 200, status
    times = []
    for i in range(swaps):
        status, seconds = ask(url, names[(i + 1) % 2])
        assert status == 200, status
        times.append(seconds)
    return times


def cold_swaps(url: str, big: Path, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        assert ask(url, MODELS[0].name)[0] == 200  # m-a up, m-big out
        drop_pages(big)
        done: list[float] = []

        def burst(done: list[float] = done) -> None:
            ask(url, MODELS[0].name, 200)
            done.append(time.perf_counter())

        threads = [threading.Thread(target=burst) for _ in range(BURST)]
        for t in threads:
            t.start()
        time.sleep(0.02)  # the burst is in flight (a bench, not a test: no event to wait on)
        status, _ = ask(url, BIG.name)
        end = time.perf_counter()
        for t in threads:
            t.join()
        assert status == 200, status
        out.append(end - max(done))
    return out


def trace_sequence(requests: int) -> list[str]:
    rng = random.Random(42)
    return rng.choices([m.name for m in MODELS], weights=WEIGHTS, k=requests)


def mixed_trace(url: str, sequence: list[str], clients: int, tokens: int) -> TraceResult:
    for m in MODELS[:2]:  # both popular models up, as in a steady state
        ask(url, m.name)
    counter = LoadCounter(url)
    todo = list(reversed(sequence))
    lock = threading.Lock()
    result = TraceResult(0.0)

    def client() -> None:
        while True:
            with lock:
                if not todo:
                    return
                model = todo.pop()
            try:
                status, seconds = ask(url, model, tokens)
            except OSError:
                status, seconds = 0, 0.0
            with lock:
                if status == 200:
                    result.latencies.append(seconds)
                else:
                    result.failures += 1

    start = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.seconds = time.perf_counter() - start
    counter.close()
    result.loads = counter.loads
    return result


def child_runs(engine: Path, model: Path, runs: int) -> tuple[list[float], list[float]]:
    """A child started as a router starts one (child mode, piped stdio): from spawn to
    its first answer (the ``ready`` line, then one request), and from the exit command to
    its exit with no connection open."""
    cold, exits = [], []
    env = {**os.environ, "LLAMA_SERVER_ROUTER_PORT": "0"}
    for _ in range(runs):
        port = free_port()
        argv = [str(engine), "--model", str(model), "--host", "127.0.0.1", "--port",
                str(port), *CHILD_ARGS]  # fmt: skip
        start = time.perf_counter()
        popen = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            env=env, start_new_session=True,
        )  # fmt: skip
        guard(popen.pid)  # killed if the bench is
        assert popen.stdout is not None
        assert popen.stdin is not None
        for line in popen.stdout:
            if b'"state":"ready"' in line:
                break
        http_json(f"http://127.0.0.1:{port}/completion", completion(model.stem), 30)
        cold.append(time.perf_counter() - start)
        start = time.perf_counter()
        popen.stdin.write(EXIT_COMMAND)
        popen.stdin.flush()
        popen.wait(30)
        exits.append(time.perf_counter() - start)
    return cold, exits


# --- report -----------------------------------------------------------------------------------


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.1f} ms"


def trace_figures(result: TraceResult) -> tuple[float, float, float]:
    """Total, p50 and p99 of one trace, in seconds."""
    lat = sorted(result.latencies)
    return result.seconds, percentile(lat, 50), percentile(lat, 99)


def ratio(a: float, b: float) -> str:
    return f"{a / b:6.2f}x" if b else "   n/a"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="fewer swaps and requests")
    parser.add_argument("--rounds", type=int, default=3, help="turns each router takes")
    parser.add_argument("--swaps", type=int, default=16, help="per round")
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=32, help="generated per trace request")
    parser.add_argument("--cold", type=int, default=5, help="cold swaps behind a busy model")
    parser.add_argument(
        "--child-threads", type=int, help="--threads N for every child (default: the engine's)"
    )
    args = parser.parse_args()
    if args.child_threads:
        CHILD_ARGS.extend(["--threads", str(args.child_threads)])
    placed = "" if args.child_threads else " (else the engine's defaults; troupe places them)"
    print(f"child flags: {' '.join(CHILD_ARGS)}{placed}")
    if args.quick:
        args.swaps, args.requests, args.clients, args.tokens, args.cold = 6, 60, 10, 8, 2
        args.rounds = 1
    engine, _ = find_engine()
    with tempfile.TemporaryDirectory(prefix="troupe-bench-swaps-") as tmp_name:
        tmp = Path(tmp_name)
        paths = write_tiny_models(tmp / "models", MODELS)
        (big,) = write_tiny_models(tmp / "models", [BIG])
        drop_pages(big)
        can_drop = resident_fraction(big) < 0.1  # not on tmpfs
        sequence = trace_sequence(args.requests)
        swaps: dict[str, list[float]] = {}
        cold: dict[str, list[float]] = {}
        traces: dict[str, list[TraceResult]] = {}
        starts: list[float] = []
        exits: list[float] = []
        for turn in range(args.rounds):
            for kind in ("troupe", "C++ router"):
                with router(kind, engine, tmp, 1) as url:
                    swaps.setdefault(kind, []).extend(single_swaps(url, args.swaps))
                    if can_drop and turn == 0:
                        cold[kind] = cold_swaps(url, big, args.cold)
                with router(kind, engine, tmp, 2) as url:
                    trace = mixed_trace(url, sequence, args.clients, args.tokens)
                    traces.setdefault(kind, []).append(trace)
            more_starts, more_exits = child_runs(engine, paths[0], max(5, args.swaps // 2))
            starts += more_starts
            exits += more_exits
    report(args, swaps, traces, starts, exits)
    report_cold(args, cold)
    return 0


def report(
    args: argparse.Namespace,
    swaps: dict[str, list[float]],
    traces: dict[str, list[TraceResult]],
    cold: list[float],
    exits: list[float],
) -> None:
    t, c = "troupe", "C++ router"
    n = args.swaps * args.rounds
    print(
        f"single swap, --models-max 1, {n} swaps in {args.rounds} turns (latency of the request):"
    )
    print(f"  {'':22}{'troupe':>12}{'C++ router':>12}{'ratio':>9}")
    # The C++ router's swaps come in two kinds (about 20 ms, or about 70 ms when its
    # victim takes 50 ms to exit), so its median flips with the mix; the mean does not.
    for label, pick in (("median", statistics.median), ("mean", statistics.mean), ("worst", max)):
        a, b = pick(swaps[t]), pick(swaps[c])
        print(f"  {label:22}{ms(a):>12}{ms(b):>12}{ratio(a, b):>9}")
    floor = statistics.median(cold) + statistics.median(exits)
    added = {k: statistics.median(v) - floor for k, v in swaps.items()}
    print(f"  child cold start to first answer (direct), median {ms(statistics.median(cold))}")
    print(f"  child exit after the exit command, median        {ms(statistics.median(exits))}")
    print(f"  troupe's added time over cold start + exit: {ms(added[t])}")
    print(f"  C++ router's added time over the same:      {ms(added[c])}")
    print()
    weights = "/".join(f"{w:g}" for w in WEIGHTS)
    print(f"mixed trace, --models-max 2, {args.requests} requests of {args.tokens} tokens over "
          f"3 models (weights {weights}), {args.clients} clients, "
          f"median of {args.rounds} turns:")  # fmt: skip
    print(f"  {'':22}{'troupe':>12}{'C++ router':>12}{'ratio':>9}")
    figures = {k: [trace_figures(r) for r in runs] for k, runs in traces.items()}
    for i, label in enumerate(("total", "p50", "p99")):
        a = statistics.median(f[i] for f in figures[t])
        b = statistics.median(f[i] for f in figures[c])
        print(f"  {label:22}{ms(a):>12}{ms(b):>12}{ratio(a, b):>9}")
    loads = {k: statistics.median(r.loads for r in runs) for k, runs in traces.items()}
    failures = {k: sum(r.failures for r in runs) for k, runs in traces.items()}
    print(f"  {'loads':22}{loads[t]:>12g}{loads[c]:>12g}")
    print(f"  {'failed requests (all)':22}{failures[t]:>12}{failures[c]:>12}")
    for kind in (t, c):
        each = ", ".join(
            f"{total * 1000:.0f}/{p99 * 1000:.0f}/{r.loads}"
            for (total, _, p99), r in zip(figures[kind], traces[kind], strict=True)
        )
        print(f"  {kind} each turn (total ms/p99 ms/loads): {each}")
    medians = {k: round(statistics.median(v) * 1000, 2) for k, v in swaps.items()}
    print(json.dumps({"swap_median_ms": medians}))


def report_cold(args: argparse.Namespace, cold: dict[str, list[float]]) -> None:
    print()
    if not cold:
        print("cold swap: skipped (this filesystem keeps the model's pages in memory)")
        return
    t, c = "troupe", "C++ router"
    head = f"cold swap behind a busy model, --models-max 1, {args.cold} runs ({BIG.name}, "
    print(head + "about 126 MB, out of the page cache; from the burst's last answer to its own):")
    print(f"  {'':22}{'troupe':>12}{'C++ router':>12}{'ratio':>9}")
    a, b = statistics.median(cold[t]), statistics.median(cold[c])
    print(f"  {'median':22}{ms(a):>12}{ms(b):>12}{ratio(a, b):>9}")


if __name__ == "__main__":
    raise SystemExit(main())
