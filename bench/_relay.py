"""The relay's own figures, against `_sse_engine.py` (a child faster than any relay).

* burst: streams of N events written back to back by the child, through troupe and
  straight from the child: events/s and troupe's CPU per event (the relay's figure,
  not the child's);
* held: 1,000 streams open at once through troupe, each at a steady rate: per-stream
  event rates (none may starve) and troupe's RSS;
* idle: memory per idle client connection (RSS before and after opening them).

llama.cpp's router cannot spawn another engine, so it has no column here; its CPU per
event on the real engine is in the real-engine SSE table of bench/proxy.py.
"""

from __future__ import annotations

import contextlib
import json
import resource
import select
import shlex
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import psutil

from _util import Proc, start_process

HERE = Path(__file__).resolve().parent


@dataclass
class BurstResult:
    streams: int
    events: int
    seconds: float
    proxy_cpu_s: float

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds if self.seconds > 0 else 0.0

    @property
    def cpu_us_per_event(self) -> float:
        return self.proxy_cpu_s / self.events * 1e6 if self.events else float("nan")


@dataclass
class HeldResult:
    streams: int
    rate: float
    seconds: float
    per_stream: list[int]  # events each stream got
    rss_before: int
    rss_peak: int
    proxy_cpu_s: float
    errors: int
    fds_before: int = 0
    fds_after: int = 0  # once every stream ended (a leak shows here)


@dataclass
class IdleResult:
    connections: int
    rss_before: int
    rss_after: int

    @property
    def per_connection(self) -> float:
        return (self.rss_after - self.rss_before) / self.connections


def write_engine(directory: Path) -> Path:
    path = directory / "sse-engine"
    script = HERE / "_sse_engine.py"
    src = HERE.parent / "src"
    path.write_text(
        "#!/bin/sh\n"
        f'export PYTHONPATH={shlex.quote(str(src))}"${{PYTHONPATH:+:$PYTHONPATH}}"\n'
        f'exec {shlex.quote(sys.executable)} {shlex.quote(str(script))} "$@"\n'
    )
    path.chmod(0o755)
    return path


def raise_fd_limit(wanted: int = 16384) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(wanted, hard), hard))


def start_troupe(
    stack: contextlib.ExitStack, tmp: Path, models_dir: Path, model: str
) -> tuple[Proc, str]:
    """troupe in front of `_sse_engine.py`, its model loaded; the process and its URL."""
    engine = write_engine(tmp)
    argv = [sys.executable, "-m", "troupe", "serve", "--engine", str(engine),
            "--state-dir", str(tmp / "relay-state"), "--models-dir", str(models_dir),
            "--host", "127.0.0.1", "--port", "0"]  # fmt: skip
    proc = start_process("troupe-relay", argv, tmp)
    stack.callback(proc.stop, 15.0)
    url = proc.wait_listening(60)
    for _ in range(600):  # the first request loads the model
        with contextlib.suppress(OSError):
            if _post(url, "/tokenize", {"model": model}).startswith(b"HTTP/1.1 200"):
                return proc, url
        time.sleep(0.05)
    raise RuntimeError(f"the relay bench's child did not come up:\n{proc.tail()}")


def child_url(proc: Proc) -> str:
    for child in psutil.Process(proc.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            cmd = child.cmdline()
            if "--port" in cmd:
                return f"http://127.0.0.1:{cmd[cmd.index('--port') + 1]}"
    raise RuntimeError("no child found")


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


def _request(url: str, path: str, body: dict[str, object]) -> bytes:
    payload = json.dumps(body).encode()
    host, port = _address(url)
    return (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload


def _post(url: str, path: str, body: dict[str, object]) -> bytes:
    with socket.create_connection(_address(url), timeout=30) as sock:
        sock.sendall(_request(url, path, body))
        return sock.recv(65536)


def _cpu(pid: int | None) -> float:
    if pid is None:
        return 0.0
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def burst(url: str, model: str, events: int, streams: int, proxy_pid: int | None) -> BurstResult:
    """``streams`` streams of ``events`` events at once; counts ``data:`` lines."""
    body = {"model": model, "n_predict": events, "stream": True}
    return streams_at_once(url, body, streams, proxy_pid)


def streams_at_once(
    url: str, body: dict[str, object], streams: int, proxy_pid: int | None
) -> BurstResult:
    """``streams`` ``POST /completion`` with ``body`` at once, each read to its end."""
    wire = _request(url, "/completion", body)
    socks = [socket.create_connection(_address(url)) for _ in range(streams)]
    poller = select.epoll()
    tails = {s.fileno(): b"" for s in socks}
    counts = dict.fromkeys(tails, 0)
    by_fd = {s.fileno(): s for s in socks}
    cpu0 = _cpu(proxy_pid)
    t0 = time.perf_counter()
    for s in socks:
        s.sendall(wire)
        poller.register(s.fileno(), select.EPOLLIN)
    open_fds = set(tails)
    while open_fds:
        for fd, _ in poller.poll(30):
            data = by_fd[fd].recv(1 << 20)
            joined = tails[fd] + data  # a "data: " split between two reads counts once
            counts[fd] += joined.count(b"data: ")
            tails[fd] = joined[-5:]
            if not data or data.endswith(b"\r\n0\r\n\r\n"):
                poller.unregister(fd)
                open_fds.discard(fd)
    seconds = time.perf_counter() - t0
    cpu = _cpu(proxy_pid) - cpu0
    for s in socks:
        s.close()
    poller.close()
    return BurstResult(streams, sum(counts.values()), seconds, cpu)


def held(url: str, model: str, proc: Proc, streams: int, rate: float, seconds: float) -> HeldResult:
    """``streams`` streams open at once, each at ``rate`` events/s for ``seconds``."""
    n = int(rate * seconds)
    wire = _request(
        url, "/completion", {"model": model, "n_predict": n, "rate": rate, "stream": True}
    )
    me = psutil.Process(proc.pid)
    rss_before = me.memory_info().rss
    fds_before = me.num_fds()
    poller = select.epoll()
    socks: dict[int, socket.socket] = {}
    counts: dict[int, int] = {}
    tails: dict[int, bytes] = {}
    errors = 0
    cpu0 = _cpu(proc.pid)
    for _ in range(streams):
        s = socket.create_connection(_address(url))
        s.setblocking(False)
        s.sendall(wire)
        socks[s.fileno()] = s
        counts[s.fileno()] = 0
        tails[s.fileno()] = b""
        poller.register(s.fileno(), select.EPOLLIN)
    peak = rss_before
    open_fds = set(socks)
    deadline = time.monotonic() + seconds * 3 + 30
    last_rss = 0.0
    while open_fds and time.monotonic() < deadline:
        for fd, _ in poller.poll(0.5):
            try:
                data = socks[fd].recv(65536)
            except OSError:
                data = b""
                errors += 1
            joined = tails[fd] + data
            counts[fd] += joined.count(b"data: ")
            tails[fd] = joined[-5:]
            if not data or data.endswith(b"\r\n0\r\n\r\n"):
                poller.unregister(fd)
                open_fds.discard(fd)
        if time.monotonic() - last_rss > 0.5:
            last_rss = time.monotonic()
            peak = max(peak, me.memory_info().rss)
    cpu = _cpu(proc.pid) - cpu0
    errors += len(open_fds)
    for s in socks.values():
        s.close()
    poller.close()
    fds_after = me.num_fds()
    for _ in range(100):  # until troupe has seen every close
        if fds_after <= fds_before:
            break
        time.sleep(0.05)
        fds_after = me.num_fds()
    return HeldResult(
        streams, rate, seconds, sorted(counts.values()), rss_before, peak, cpu, errors,
        fds_before, fds_after,
    )  # fmt: skip


def idle(url: str, proc: Proc, connections: int) -> IdleResult:
    """RSS before and after ``connections`` idle clients connect (each sent one request,
    so each is a served keep-alive connection, not just an accepted socket)."""
    me = psutil.Process(proc.pid)
    probe = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    time.sleep(0.5)
    before = me.memory_info().rss
    socks = []
    for _ in range(connections):
        s = socket.create_connection(_address(url))
        s.sendall(probe)
        socks.append(s)
    for s in socks:
        s.recv(65536)
    time.sleep(0.3)
    after = me.memory_info().rss
    for s in socks:
        s.close()
    return IdleResult(connections, before, after)
