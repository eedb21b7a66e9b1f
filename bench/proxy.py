"""Proxy overhead: the child directly vs troupe vs llama-server's own (C++) router.

Starts, side by side, a standalone ``llama-server`` on a tiny GGUF (the child
"directly"), ``troupe serve`` and ``llama-server --models-dir`` (the C++ router)
on a directory holding that model, each router with its own child started with
the same arguments. Each process is separate from this one, so the load
generator never shares an event loop with a server. Then, for each scenario, it
measures the three targets back to back (so a change in machine load hits all
three alike) and prints:

* small requests that are cheap for the child (``POST /tokenize``,
  ``GET /slots?model=``) at concurrency 1 (latency) and N (throughput): req/s,
  p50, p99, and CPU time per request of the proxy, the child and the client;
* one long streamed ``/completion`` (SSE) through each: events/s and the proxy's
  CPU time per event (what bounds its relay rate once the child is faster);
* the ratios troupe/direct, C++ router/direct and troupe/C++ router;
* the relay's own figures (bench/_relay.py), against a stand-in child that writes
  events faster than any relay forwards them: burst streams (events/s, troupe's CPU
  per event), paced streams that arrive one event per read, 1,000 streams held open
  at once (per-stream event counts, troupe's RSS), and memory per idle connection.

``--profile`` samples troupe with py-spy during the small-request scenarios and
prints where its CPU goes (self time by function).

The load generator is ``wrk`` when it is on PATH, else a built-in epoll client;
the direct figures use the same client, so the ratios compare like with like.

    .venv/bin/python bench/proxy.py [--quick] [--fake] [--connections 8,64] [--seconds S]
        [--no-relay] [--no-sse] [--post-only] [--streams 1000] [--profile] [--access-log]
        [--baseline /path/to/other/checkout/src]

troupe's CPU per request (user + system time of its process, from ``/proc/PID/stat``,
over the measured window) is printed beside each req/s: on a machine shared with other
work, wall-clock req/s moves with the neighbours' load, CPU per request much less, so
it is the figure to compare across runs. ``--baseline SRC`` adds troupe run from another
source tree (a checkout of an older commit), measured in the same run: the ratios then
include troupe/baseline, what a change to troupe's hot path bought.

``--access-log`` adds a fourth target, troupe with ``--access-log on`` (its lines go to
its log file), and prints what the access log costs: troupe+log against troupe, per
scenario, from the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import psutil

import _relay
from _util import (
    HttpRequest,
    LoadResult,
    Proc,
    SseResult,
    http_json,
    print_child_flags,
    run_load,
    run_wrk,
    start_process,
    stream_events,
)
from troupe.engine import find_engine
from troupe_rig import TinyModel, write_fake_engine, write_tiny_models

MODEL = TinyModel(name="bench-tiny", n_ctx=4096)
CHILD_ARGS = ["--threads", "1", "--ctx-size", str(MODEL.n_ctx)]


@dataclass
class Target:
    name: str
    url: str
    proc: Proc
    child: psutil.Process
    proxy: psutil.Process | None  # None: the client talks to the child itself


@dataclass(frozen=True)
class Scenario:
    label: str
    request: HttpRequest
    connections: int


@dataclass
class Figures:
    load: LoadResult
    proxy_cpu_s: float  # CPU seconds over the measured window
    child_cpu_s: float
    client_cpu_s: float

    def per_request_us(self, cpu_s: float) -> float:
        return cpu_s / self.load.requests * 1e6 if self.load.requests else float("nan")


@dataclass
class SseFigures:
    result: SseResult
    proxy_cpu_s: float
    child_cpu_s: float


@dataclass
class Report:
    scenarios: list[Scenario] = field(default_factory=list)
    figures: dict[tuple[str, str], Figures] = field(default_factory=dict)  # (scenario, target)
    sse: dict[str, SseFigures] = field(default_factory=dict)
    sse_many: dict[str, tuple[_relay.BurstResult, float]] = field(default_factory=dict)
    relay: list[tuple[str, _relay.BurstResult]] = field(default_factory=list)
    paced: _relay.HeldResult | None = None
    held: _relay.HeldResult | None = None
    idle: _relay.IdleResult | None = None
    profile: list[str] = field(default_factory=list)


# --- processes -------------------------------------------------------------------------------


def _cpu(proc: psutil.Process | None) -> float:
    if proc is None:
        return 0.0
    try:
        t = proc.cpu_times()
    except psutil.Error:
        return float("nan")
    return t.user + t.system


def _client_cpu() -> float:
    t = os.times()  # this process, plus waited-for children (wrk)
    return t.user + t.system + t.children_user + t.children_system


def _wait_answers(proc: Proc, url: str, body: object | None, timeout: float) -> None:
    """Until ``url`` answers 200 (the model has loaded)."""
    deadline = time.monotonic() + timeout
    while not _answers(url, body):
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited ({proc.popen.returncode}):\n{proc.tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{proc.name}: not ready within {timeout:g} s:\n{proc.tail()}")
        time.sleep(0.05)


def _answers(url: str, body: object | None = None) -> bool:
    try:
        status, _ = http_json(url, body, timeout=60)
    except OSError:
        return False
    return status == 200


def _find_child(proc: Proc, model: Path) -> psutil.Process:
    for candidate in proc.remember_descendants():
        with contextlib.suppress(psutil.Error):
            if str(model) in candidate.cmdline():
                return candidate
    raise RuntimeError(f"{proc.name}: no child serving {model} found")


def start_targets(
    stack: contextlib.ExitStack,
    engine: Path,
    tmp: Path,
    fake: bool,
    access_log: bool = False,
    only: frozenset[str] | None = None,
    baseline: Path | None = None,
) -> list[Target]:
    models_dir = tmp / "models"
    (model,) = write_tiny_models(models_dir, [MODEL])
    host = ["--host", "127.0.0.1", "--port", "0"]
    env = dict(os.environ)
    env.pop("LLAMA_SERVER_ROUTER_PORT", None)
    commands: dict[str, list[str]] = {
        "direct": [str(engine), "--model", str(model), *host, *CHILD_ARGS],
        "troupe": [sys.executable, "-m", "troupe", "serve", "--engine", str(engine),
                   "--state-dir", str(tmp / "state"), "--models-dir", str(models_dir),
                   *host, *CHILD_ARGS],
        "C++ router": [str(engine), "--models-dir", str(models_dir), *host, *CHILD_ARGS],
    }  # fmt: skip
    if access_log:
        commands[LOGGED] = [*commands["troupe"], "--access-log", "on"]
        commands[LOGGED][commands[LOGGED].index(str(tmp / "state"))] = str(tmp / "state-log")
    if baseline is not None:  # troupe from another source tree (a checkout of main)
        boot = f"import sys; sys.path.insert(0, {str(baseline)!r}); from troupe.cli import main; "
        commands[BASELINE] = [sys.executable, "-c", boot + "sys.exit(main())",
                              *commands["troupe"][3:]]  # fmt: skip
        commands[BASELINE][commands[BASELINE].index(str(tmp / "state"))] = str(tmp / "state-base")
    if fake:
        del commands["C++ router"]  # it would start copies of itself, not the fake
    if only is not None:
        commands = {name: argv for name, argv in commands.items() if name in only}
    procs: dict[str, Proc] = {}
    for name, argv in commands.items():
        procs[name] = proc = start_process(name, argv, tmp, env)
        stack.callback(proc.stop, 15.0)
    targets: list[Target] = []
    probe = {"model": MODEL.name, "content": "hello"}
    for name, proc in procs.items():
        url = proc.wait_listening(60)
        if name == "direct":
            _wait_answers(proc, f"{url}/health", None, 60)
            child, proxy = psutil.Process(proc.pid), None
        else:  # the first request loads the model (autoload)
            _wait_answers(proc, f"{url}/tokenize", probe, 60)
            child, proxy = _find_child(proc, model), psutil.Process(proc.pid)
        targets.append(Target(name, url, proc, child, proxy))
    return targets


# --- measuring -------------------------------------------------------------------------------


def measure(
    target: Target, scenario: Scenario, seconds: float, warmup: float, use_wrk: bool
) -> Figures:
    marks: list[tuple[float, float, float]] = []

    def mark() -> None:
        marks.append((_cpu(target.proxy), _cpu(target.child), _client_cpu()))  # /proc/PID/stat

    runner = run_wrk if use_wrk else run_load
    load = runner(target.url, scenario.request, scenario.connections, seconds, warmup, mark)
    mark()
    (p0, c0, k0), (p1, c1, k1) = marks[0], marks[-1]
    return Figures(load, p1 - p0, c1 - c0, k1 - k0)


def measure_sse(target: Target, n_predict: int) -> SseFigures:
    def completion(n: int) -> HttpRequest:
        body = {"model": MODEL.name, "prompt": "hello", "n_predict": n, "stream": True,
                "ignore_eos": True, "cache_prompt": False}  # fmt: skip
        return HttpRequest("POST", "/completion", json.dumps(body).encode())

    stream_events(target.url, completion(16))  # warm-up
    p0, c0 = _cpu(target.proxy), _cpu(target.child)
    result = stream_events(target.url, completion(n_predict))
    return SseFigures(result, _cpu(target.proxy) - p0, _cpu(target.child) - c0)


def measure_sse_many(
    target: Target, n_predict: int, streams: int
) -> tuple[_relay.BurstResult, float]:
    """``streams`` streamed completions at once (the child's slots in parallel): the
    relay's CPU per event when events arrive one by one from several streams."""
    body = {"model": MODEL.name, "prompt": "hello", "n_predict": n_predict, "stream": True,
            "ignore_eos": True, "cache_prompt": False}  # fmt: skip
    c0 = _cpu(target.child)
    pid = target.proxy.pid if target.proxy is not None else None
    result = _relay.streams_at_once(target.url, body, streams, pid)
    return result, _cpu(target.child) - c0


def scenarios(concurrency: list[int], post_only: bool = False) -> list[Scenario]:
    tokenize = json.dumps({"model": MODEL.name, "content": "hello world"}).encode()
    post = HttpRequest("POST", "/tokenize", tokenize)
    get = HttpRequest("GET", f"/slots?model={MODEL.name}")
    levels = sorted({1, *concurrency})
    return [
        *(Scenario(f"POST /tokenize c={c}", post, c) for c in levels),
        *(() if post_only else (Scenario(f"GET /slots?model= c={c}", get, c) for c in levels)),
    ]


# --- output ----------------------------------------------------------------------------------

PAIRS = (
    ("troupe", "direct"),
    ("C++ router", "direct"),
    ("troupe", "C++ router"),
    ("troupe", "baseline"),
)
LOGGED = "troupe+log"  # troupe with --access-log on (bench --access-log)
BASELINE = "baseline"  # troupe from another source tree (bench/access_log.py --baseline)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def _ratio(a: float, b: float) -> str:
    if math.isnan(a) or math.isnan(b) or b <= 0:
        return "n/a"
    return f"{a / b:.2f}x"


def _us(cpu_s: float, count: int) -> str:
    return f"{cpu_s / count * 1e6:.0f}" if count else "n/a"


def _table(rows: list[list[str]], header: list[str]) -> None:
    """Left-aligned first two columns, right-aligned numbers."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for n, row in enumerate([header, *rows]):
        cells = [
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        ]
        print("  ".join(cells).rstrip())
        if n == 0:
            print("-" * (sum(widths) + 2 * (len(widths) - 1)))


def print_report(report: Report, targets: list[str]) -> None:
    print(
        "\nsmall requests (latency from the request's first byte, or its connect, to its last byte)"
    )
    rows: list[list[str]] = []
    for sc in report.scenarios:
        base = report.figures[(sc.label, "direct")].load
        for i, name in enumerate(targets):
            f = report.figures[(sc.label, name)]
            n = f.load.requests
            direct = name == "direct"
            rows.append([
                "" if i else sc.label,
                name,
                f"{f.load.rps:.0f}",
                _ms(f.load.p50_s),
                _ms(f.load.p99_s),
                "" if direct else f"{(f.load.p50_s - base.p50_s) * 1e3:+.3f}",
                "" if direct else f"{(f.load.p99_s - base.p99_s) * 1e3:+.3f}",
                "-" if direct else _us(f.proxy_cpu_s, n),
                _us(f.child_cpu_s, n),
                _us(f.client_cpu_s, n),
                str(f.load.errors),
            ])  # fmt: skip
    _table(rows, ["scenario", "target", "req/s", "p50 ms", "p99 ms", "added p50", "added p99",
                  "proxy CPU us/req", "child", "client", "errors"])  # fmt: skip

    if report.sse:
        print("\none long streamed /completion (SSE); events/s over the whole request")
        rows = []
        for name in targets:
            s = report.sse[name]
            n = s.result.events
            rows.append([
                "", name, str(n), f"{s.result.events_per_s:.0f}", _ms(s.result.first_event_s),
                "-" if name == "direct" else f"{s.proxy_cpu_s / max(1, n) * 1e6:.1f}",
                f"{s.child_cpu_s / max(1, n) * 1e6:.1f}",
            ])  # fmt: skip
        _table(rows, ["", "target", "events", "events/s", "first ms",
                      "proxy CPU us/event", "child"])  # fmt: skip

    print_relay(report)
    if report.sse_many:
        n = next(iter(report.sse_many.values()))[0].streams
        print(f"\n{n} streamed /completion at once (real engine); events/s over all of them")
        rows = []
        for name in targets:
            r, child_cpu = report.sse_many[name]
            rows.append([
                "", name, str(r.events), f"{r.events_per_s:.0f}",
                "-" if name == "direct" else f"{r.cpu_us_per_event:.1f}",
                f"{child_cpu / max(1, r.events) * 1e6:.1f}",
            ])  # fmt: skip
        _table(rows, ["", "target", "events", "events/s", "proxy CPU us/event", "child"])
    pairs = [(a, b) for a, b in PAIRS if a in targets and b in targets]
    print("\nratios (req/s and events/s: higher is better; latency and CPU: lower is better)")
    rows = []

    def ratio_row(label: str, what: str, value: dict[str, float]) -> None:
        rows.append([label, what, *(_ratio(value[a], value[b]) for a, b in pairs)])

    def cpu_row(what: str, value: dict[str, float]) -> None:  # (direct has no proxy)
        rows.append(["", what, *("" if "direct" in (a, b) else _ratio(value[a], value[b])
                                 for a, b in pairs)])  # fmt: skip

    for sc in report.scenarios:
        fig = {name: report.figures[(sc.label, name)] for name in targets}
        ratio_row(sc.label, "req/s", {t: f.load.rps for t, f in fig.items()})
        ratio_row("", "p50", {t: f.load.p50_s for t, f in fig.items()})
        ratio_row("", "p99", {t: f.load.p99_s for t, f in fig.items()})
        cpu_row("proxy CPU/req", {t: f.proxy_cpu_s / max(1, f.load.requests)
                                  for t, f in fig.items()})  # fmt: skip
    if report.sse:
        sse = report.sse
        ratio_row("SSE stream", "events/s", {t: sse[t].result.events_per_s for t in targets})
        cpu_row(
            "proxy CPU/event",
            {t: sse[t].proxy_cpu_s / max(1, sse[t].result.events) for t in targets},
        )
    if report.sse_many:
        many = report.sse_many
        ratio_row("SSE streams at once", "events/s", {t: many[t][0].events_per_s for t in targets})
        cpu_row("proxy CPU/event", {t: many[t][0].cpu_us_per_event for t in targets})
    _table(rows, ["", "", *(f"{a}/{b}" for a, b in pairs)])
    if LOGGED in targets:
        print_access_log_cost(report)


def print_access_log_cost(report: Report) -> None:
    """troupe with the access log on against troupe without, from the same run."""
    print(f"\naccess log: {LOGGED}/troupe (req/s, events/s: 1.00 is free; CPU: 1.00 is free)")
    rows = []
    for sc in report.scenarios:
        on, off = report.figures[(sc.label, LOGGED)], report.figures[(sc.label, "troupe")]
        rows.append([
            sc.label, _ratio(on.load.rps, off.load.rps), _ratio(on.load.p50_s, off.load.p50_s),
            _ratio(on.proxy_cpu_s / max(1, on.load.requests),
                   off.proxy_cpu_s / max(1, off.load.requests)),
        ])  # fmt: skip
    if report.sse:
        on_s, off_s = report.sse[LOGGED], report.sse["troupe"]
        rows.append([
            "SSE stream", _ratio(on_s.result.events_per_s, off_s.result.events_per_s), "",
            _ratio(on_s.proxy_cpu_s / max(1, on_s.result.events),
                   off_s.proxy_cpu_s / max(1, off_s.result.events)),
        ])  # fmt: skip
    _table(rows, ["scenario", "req/s", "p50", "proxy CPU/req (or /event)"])


# --- main ------------------------------------------------------------------------------------


@contextlib.contextmanager
def _process_stack() -> Iterator[contextlib.ExitStack]:
    """An ExitStack for the processes the bench starts. While it is open, SIGTERM and
    SIGHUP end the bench as Ctrl-C does; while it unwinds (stopping every process), all
    three are ignored, so a second Ctrl-C cannot cut the cleanup short."""
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {s: signal.getsignal(s) for s in signals}

    def interrupt(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGHUP, interrupt)
    try:
        with contextlib.ExitStack() as procs:
            try:
                yield procs
            finally:
                for s in signals:
                    signal.signal(s, signal.SIG_IGN)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2 s per measurement (default 5 s)")
    ap.add_argument("--fake", action="store_true", help="the fake engine (no C++ router then)")
    ap.add_argument("--seconds", type=float, help="measured seconds per scenario and target")
    ap.add_argument("--warmup", type=float, help="seconds of warm-up before each measurement")
    ap.add_argument(
        "--connections",
        type=lambda text: [int(c) for c in text.split(",")],
        default=[8, 64],
        help="concurrency levels for throughput, besides 1 (default 8,64)",
    )
    ap.add_argument("--n-predict", type=int, help="tokens in the SSE stream (default 4000)")
    ap.add_argument("--engine", help="llama-server binary (default: troupe's find_engine)")
    ap.add_argument("--no-wrk", action="store_true", help="built-in client even if wrk is there")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory (logs)")
    ap.add_argument("--no-relay", action="store_true", help="skip the relay's own scenarios")
    ap.add_argument("--sse-streams", type=int, default=4, help="real-engine streams at once")
    ap.add_argument("--streams", type=int, default=1000, help="streams held open at once")
    ap.add_argument("--profile", action="store_true", help="py-spy troupe (small requests)")
    ap.add_argument("--access-log", action="store_true", help="also troupe with --access-log on")
    ap.add_argument("--no-sse", action="store_true", help="skip the real-engine SSE streams")
    ap.add_argument("--post-only", action="store_true", help="POST /tokenize only (no GET /slots)")
    ap.add_argument("--baseline", type=Path, help="src/ of another checkout: troupe from it too")
    return ap.parse_args()


def _progress(text: str, end: str = "") -> None:
    print(text, end=end, flush=True, file=sys.stderr)


def run(args: argparse.Namespace, engine: Path, tmp: Path, report: Report) -> list[str]:
    """Start the targets, measure everything, stop every process (also on error or Ctrl-C)."""
    seconds = args.seconds or (2.0 if args.quick else 5.0)
    warmup = args.warmup if args.warmup is not None else (0.5 if args.quick else 1.0)
    n_predict = min(args.n_predict or (2000 if args.quick else 4000), MODEL.n_ctx - 8)
    use_wrk = shutil.which("wrk") is not None and not args.no_wrk
    client = f"wrk ({shutil.which('wrk')})" if use_wrk else "built-in epoll client (Python)"
    levels = ", ".join(str(c) for c in args.connections)
    print(f"client:  {client}, {levels} connections for throughput (and 1 for latency)")
    print(f"timing:  {warmup:g} s warm-up + {seconds:g} s measured per scenario and target")
    print(f"SSE:     one /completion stream of n_predict={n_predict} per target")
    with _process_stack() as procs:
        targets = start_targets(
            procs, engine, tmp, args.fake, args.access_log, baseline=args.baseline
        )
        for sc in report.scenarios:
            for t in targets:
                _progress(f"  {sc.label:<28} {t.name:<11}")
                profiling = args.profile and t.name == "troupe" and sc.connections > 1
                spy = _start_profile(t, seconds + warmup, tmp) if profiling else None
                f = measure(t, sc, seconds, warmup, use_wrk)
                if spy is not None:
                    report.profile += [f"{sc.label}:", *_finish_profile(spy, tmp)]
                cpu_us = _us(f.proxy_cpu_s, f.load.requests)
                cpu = "" if t.proxy is None else f"  {cpu_us:>5} us CPU/req"
                _progress(f" {f.load.rps:8.0f} req/s{cpu}", "\n")
                report.figures[(sc.label, t.name)] = f
        if not args.no_sse:
            for t in targets:
                _progress(f"  {'SSE stream':<28} {t.name:<11}")
                s = measure_sse(t, n_predict)
                _progress(f" {s.result.events_per_s:8.0f} events/s", "\n")
                report.sse[t.name] = s
            for t in targets:
                _progress(f"  {f'SSE x{args.sse_streams} streams':<28} {t.name:<11}")
                many = measure_sse_many(t, n_predict, args.sse_streams)
                _progress(f" {many[0].events_per_s:8.0f} events/s", "\n")
                report.sse_many[t.name] = many
    if not args.no_relay:
        run_relay(args, tmp, report)
    return [t.name for t in targets]


def run_relay(args: argparse.Namespace, tmp: Path, report: Report) -> None:
    """The relay's own scenarios, against `_sse_engine.py` (its own troupe)."""
    _relay.raise_fd_limit()
    events = 50_000 if args.quick else 200_000
    with _process_stack() as procs:
        proc, url = _relay.start_troupe(procs, tmp, tmp / "models", MODEL.name)
        _progress(f"  {'idle connections':<28} {'troupe':<11}")
        report.idle = _relay.idle(url, proc, 1000)
        _progress(f" {report.idle.per_connection / 1024:8.1f} KiB each", "\n")
        direct = _relay.child_url(proc)
        for streams in (1, 4):
            for name, target, pid in (("direct", direct, None), ("troupe", url, proc.pid)):
                _progress(f"  {f'SSE burst x{streams}':<28} {name:<11}")
                r = _relay.burst(target, MODEL.name, events // streams, streams, pid)
                _progress(f" {r.events_per_s:8.0f} events/s", "\n")
                report.relay.append((name, r))
        seconds = 3.0 if args.quick else 10.0
        _progress(f"  {'SSE paced 64 x 300/s':<28} {'troupe':<11}")
        report.paced = _relay.held(url, MODEL.name, proc, 64, 300.0, seconds)
        _progress(" done", "\n")
        _progress(f"  {f'SSE held x{args.streams}':<28} {'troupe':<11}")
        report.held = _relay.held(url, MODEL.name, proc, args.streams, 5.0, seconds * 2)
        _progress(" done", "\n")


def _start_profile(target: Target, seconds: float, tmp: Path) -> subprocess.Popen[bytes] | None:
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if target.proxy is None or not Path(spy).exists():
        return None
    argv = [spy, "record", "-p", str(target.proxy.pid), "-d", str(max(1, round(seconds))),
            "-r", "100", "-f", "raw", "-o", str(tmp / "profile.txt")]  # fmt: skip
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _finish_profile(spy: subprocess.Popen[bytes], tmp: Path, top: int = 15) -> list[str]:
    """Self time by function, from py-spy's raw (collapsed stacks) output."""
    spy.wait()
    counts: dict[str, int] = {}
    total = 0
    with contextlib.suppress(OSError):
        for line in (tmp / "profile.txt").read_text().splitlines():
            stack, _, n = line.rpartition(" ")
            if not stack or not n.isdigit():
                continue
            leaf = stack.split(";")[-1]
            name, _, where = leaf.partition(" (")
            where = where.split("site-packages/")[-1].split("/src/")[-1].rsplit(":", 1)[0]
            key = f"{name} [{where}]"
            counts[key] = counts.get(key, 0) + int(n)
            total += int(n)
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])[:top]
    return [f"  {100 * n / max(1, total):5.1f}%  {key}" for key, n in ranked]


def main() -> int:
    args = _parse_args()
    print_child_flags(CHILD_ARGS)
    load = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="troupe-bench-proxy-"))
    engine = write_fake_engine(tmp) if args.fake else find_engine(args.engine)[0]
    print(f"engine:  {engine}{' (fake)' if args.fake else ''}")
    print(f"model:   {MODEL.name} (tiny llama GGUF, n_ctx {MODEL.n_ctx})")
    print(f"child:   {' '.join(CHILD_ARGS)} (direct child and both routers alike)")
    print(f"machine: {os.cpu_count()} CPUs, load average at start {_loadavg(load)}")
    report = Report(scenarios=scenarios(args.connections, args.post_only))
    keep = True  # the logs of a run that failed
    try:
        names = run(args, engine, tmp, report)
        keep = args.keep
    except KeyboardInterrupt:
        keep = args.keep
        print("\ninterrupted; every process the bench started is stopped", file=sys.stderr)
        return 130
    except (RuntimeError, OSError) as exc:
        print(f"bench failed: {exc}", file=sys.stderr)
        return 1
    finally:
        if keep:
            print(f"logs kept in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print_report(report, names)
    print(f"\nload average at end: {_loadavg(os.getloadavg())}")
    return 0


def print_relay(report: Report) -> None:
    if report.relay:
        print("\nSSE relay against a child that writes one event per send, faster than a relay")
        rows = [["", name, str(r.streams), str(r.events), f"{r.events_per_s:.0f}",
                 "-" if name == "direct" else f"{r.cpu_us_per_event:.2f}"]
                for name, r in report.relay]  # fmt: skip
        _table(rows, ["", "target", "streams", "events", "events/s", "troupe CPU us/event"])
    for label, h in (("paced (one event per read)", report.paced), ("held open", report.held)):
        if h is None:
            continue
        got = h.per_stream
        expect = int(h.rate * h.seconds) + 1  # and the last event
        starved = sum(1 for n in got if n < expect)
        total = sum(got)
        print(f"\nSSE {label}: {h.streams} streams x {h.rate:g} events/s for {h.seconds:g} s "
              f"through troupe")  # fmt: skip
        print(f"  events per stream: min {got[0]}, median {got[len(got) // 2]}, max {got[-1]} "
              f"(expected {expect}); starved {starved}; errors {h.errors}")  # fmt: skip
        print(f"  per-stream rate: {got[0] / h.seconds:.1f}-{got[-1] / h.seconds:.1f} events/s; "
              f"troupe CPU {h.proxy_cpu_s / max(1, total) * 1e6:.1f} us/event; "
              f"RSS {h.rss_before / 2**20:.0f} -> peak {h.rss_peak / 2**20:.0f} MiB; "
              f"open fds {h.fds_before} -> {h.fds_after} after (the pool keeps up to 64 "
              f"idle connections per child)")  # fmt: skip
    if report.idle is not None:
        i = report.idle
        print(f"\nidle connections: {i.connections}, troupe RSS {i.rss_before / 2**20:.1f} -> "
              f"{i.rss_after / 2**20:.1f} MiB, {i.per_connection / 1024:.1f} KiB each")  # fmt: skip
    if report.profile:
        print("\nwhere troupe's CPU goes (py-spy, self time):")
        print("\n".join(report.profile))


def _loadavg(load: tuple[float, float, float]) -> str:
    return " ".join(f"{x:.2f}" for x in load)


if __name__ == "__main__":
    sys.exit(main())
