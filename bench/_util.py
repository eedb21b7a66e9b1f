"""Helpers for the benches: processes that always get cleaned up, and an HTTP load generator.

The load generator is a plain ``epoll`` loop over non-blocking sockets with a
minimal HTTP/1.1 response parser: much cheaper per request than httpx or an
async framework, so the client is less likely to be the bottleneck. It keeps
connections alive when the server allows it and reconnects when the server says
``Connection: close`` (the C++ router does, on every proxied response); the
reconnect is then part of the next request's latency, as a real client sees it.
`run_wrk` does the same measurement with ``wrk`` when it is installed.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import psutil

from troupe_rig.reaper import guard

__all__ = [
    "HttpRequest",
    "LoadResult",
    "Proc",
    "SseResult",
    "http_json",
    "percentile",
    "run_load",
    "run_wrk",
    "start_process",
    "stream_events",
]

_LISTENING = re.compile(r"listening on (http://\S+)")


# --- processes -------------------------------------------------------------------------------


@dataclass
class Proc:
    """A process the bench started; its output goes to ``log`` (never a pipe nobody drains)."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    known: dict[int, float] = field(default_factory=dict)  # pid -> create time, for the sweep

    @property
    def pid(self) -> int:
        return self.popen.pid

    def wait_listening(self, timeout: float) -> str:
        """The URL of the ``listening on`` line, once it is in the log."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = _LISTENING.search(self.log.read_text(errors="replace"))
            if found:
                return found.group(1).rstrip("/")
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.name} exited ({self.popen.returncode}):\n{self.tail()}")
            time.sleep(0.02)
        raise RuntimeError(f"{self.name} did not listen within {timeout:g} s:\n{self.tail()}")

    def remember_descendants(self) -> list[psutil.Process]:
        """Note every descendant now alive, so `stop` can make sure none outlives the bench."""
        with contextlib.suppress(psutil.Error):
            found = psutil.Process(self.pid).children(recursive=True)
            for proc in found:
                with contextlib.suppress(psutil.Error):
                    self.known[proc.pid] = proc.create_time()
            return found
        return []

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, grace: float) -> None:
        """SIGTERM (a router stops its children), then SIGKILL the group, then the sweep."""
        self.remember_descendants()
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.pid, signal.SIGKILL)
                self.popen.wait()
        for pid, created in self.known.items():
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if proc.create_time() == created:  # the same process, not a reused pid
                    proc.kill()
                    proc.wait(5)


def start_process(
    name: str, argv: Sequence[str], log_dir: Path, env: Mapping[str, str] | None = None
) -> Proc:
    """Start ``argv`` in its own session (a Ctrl-C to the bench does not reach it)."""
    log = log_dir / f"{name.replace(' ', '-').replace('+', '')}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(os.environ if env is None else env),
            start_new_session=True,
        )
    guard(popen.pid)  # stopped, with its group, if the bench is killed
    return Proc(name, popen, log)


@contextlib.contextmanager
def serving(
    name: str, argv: Sequence[str], log_dir: Path, wait: float = 60.0, grace: float = 20.0
) -> Iterator[str]:
    """``argv`` (a router or a server, not a child of one) started, its URL once it
    listens; stopped when the block ends."""
    env = dict(os.environ)
    env.pop("LLAMA_SERVER_ROUTER_PORT", None)  # set when the bench runs under a router
    proc = start_process(name, argv, log_dir, env)
    try:
        yield proc.wait_listening(wait)
    finally:
        proc.stop(grace)


def print_child_flags(flags: Sequence[str]) -> None:
    """Said before a relay bench's figures: its children's hand-set ``--threads 1`` (the
    same for every target) is part of what they mean."""
    print(
        f"child flags: {' '.join(flags)} (one thread for every target: the relay's own cost"
        " is measured, not how children share the cores; bench/swaps.py and bench/cpu.py"
        " run the engine's defaults)"
    )


def serve_tiny_both_ways(
    stack: contextlib.ExitStack, tmp: Path, engine: Path, model: Path, alias: str,
    child_args: Sequence[str],
) -> tuple[dict[str, str], dict[str, Proc]]:  # fmt: skip
    """``model`` served by the engine alone (``direct``) and by ``troupe serve`` over its
    folder (``troupe``) with the same child flags: their URLs, once listening, and their
    processes, each stopped when ``stack`` closes."""
    host = ["--host", "127.0.0.1", "--port", "0"]
    env = dict(os.environ)
    env.pop("LLAMA_SERVER_ROUTER_PORT", None)
    commands = {
        "direct": [str(engine), "--model", str(model), "--alias", alias, *host, *child_args],
        "troupe": [sys.executable, "-m", "troupe", "serve", "--engine", str(engine),
                   "--state-dir", str(tmp / "state"), "--models-dir", str(model.parent),
                   *host, *child_args],
    }  # fmt: skip
    urls, procs = {}, {}
    for name, argv in commands.items():
        procs[name] = proc = start_process(name, argv, tmp, env)
        stack.callback(proc.stop, 15.0)
        urls[name] = proc.wait_listening(60)
    return urls, procs


def http_json(url: str, body: object | None = None, timeout: float = 60.0) -> tuple[int, object]:
    """One blocking request (GET, or POST with a JSON body); status and decoded JSON."""
    parts = urlsplit(url)
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    payload = b"" if body is None else json.dumps(body).encode()
    method = "GET" if body is None else "POST"
    request = HttpRequest(method, path, payload)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(request.encode(f"{host}:{port}", close=True))
        parser = _ResponseParser(keep_body=True)
        while not parser.done:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError(f"{url}: connection closed before the response ended")
            parser.feed(data)
    text = b"".join(parser.body).decode("utf-8", "replace")
    try:
        return parser.status, json.loads(text)
    except ValueError:
        return parser.status, text


# --- HTTP/1.1 ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class HttpRequest:
    method: str
    path: str
    body: bytes = b""

    def encode(self, host: str, *, close: bool = False) -> bytes:
        lines = [f"{self.method} {self.path} HTTP/1.1", f"Host: {host}"]
        if self.body:
            lines += ["Content-Type: application/json", f"Content-Length: {len(self.body)}"]
        if close:
            lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode() + self.body


class _ResponseParser:
    """Just enough HTTP/1.1 to know where a response ends: Content-Length or chunked."""

    def __init__(self, *, keep_body: bool = False) -> None:
        self.keep_body = keep_body
        self.buf = bytearray()
        self.status = 0
        self.close = False
        self.done = False
        self.body: list[bytes] = []
        self.first_body_at = 0.0
        self._length = -1  # bytes of body still expected (Content-Length)
        self._chunked = False
        self._head_done = False
        self._chunk_left = -1  # -1: expecting a chunk-size line

    def feed(self, data: bytes) -> None:
        self.buf += data
        if not self._head_done:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buf[:end]).lower()
            del self.buf[: end + 4]
            self._head_done = True
            status_line, _, fields = head.partition(b"\r\n")
            self.status = int(status_line.split(b" ", 2)[1])
            self.close = b"connection: close" in fields or status_line.startswith(b"http/1.0")
            if b"transfer-encoding: chunked" in fields:
                self._chunked = True
            else:
                m = re.search(rb"content-length:\s*(\d+)", fields)
                self._length = int(m.group(1)) if m else 0
        if self.buf and not self.first_body_at:
            self.first_body_at = time.perf_counter()
        if self._chunked:
            self._feed_chunked()
        elif len(self.buf) >= self._length:
            self._take(bytes(self.buf[: self._length]))
            del self.buf[: self._length]
            self.done = True

    def _take(self, data: bytes) -> None:
        if self.keep_body:
            self.body.append(data)

    def _feed_chunked(self) -> None:
        buf = self.buf
        while True:
            if self._chunk_left == -2:  # after the last chunk: trailers, then an empty line
                if buf[:2] == b"\r\n":
                    del buf[:2]
                    self.done = True
                    return
                eol = buf.find(b"\r\n")
                if eol < 0:
                    return
                del buf[: eol + 2]  # a trailer field
                continue
            if self._chunk_left == -1:
                eol = buf.find(b"\r\n")
                if eol < 0:
                    return
                size = int(bytes(buf[:eol]).split(b";", 1)[0], 16)
                del buf[: eol + 2]
                self._chunk_left = size if size else -2
                continue
            if len(buf) < self._chunk_left + 2:
                if self.keep_body and len(buf) > 0 and len(buf) <= self._chunk_left:
                    # stream what is here (SSE), keep the rest of the chunk pending
                    self._take(bytes(buf))
                    self._chunk_left -= len(buf)
                    buf.clear()
                return
            self._take(bytes(buf[: self._chunk_left]))
            del buf[: self._chunk_left + 2]
            self._chunk_left = -1


# --- load generator ---------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], pct: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(pct / 100 * (len(sorted_values) - 1))))
    return sorted_values[index]


@dataclass
class LoadResult:
    requests: int  # completed inside the measured window
    errors: int  # non-2xx answers, broken connections
    seconds: float
    latencies: list[float]  # seconds, sorted; empty when the tool gives only percentiles
    connects: int = 0  # TCP connections opened (keep-alive works when this is ~connections)
    p50_s: float = float("nan")
    p99_s: float = float("nan")

    def __post_init__(self) -> None:
        if self.latencies:
            self.p50_s = percentile(self.latencies, 50)
            self.p99_s = percentile(self.latencies, 99)

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds > 0 else 0.0


class _Conn:
    __slots__ = ("parser", "sock", "started", "state")

    def __init__(self, sock: socket.socket, started: float) -> None:
        self.sock = sock
        self.started = started  # when the request (or its connect) began
        self.state = "connecting"
        self.parser = _ResponseParser()


def run_load(
    url: str,
    request: HttpRequest,
    connections: int,
    seconds: float,
    warmup: float,
    on_measure: Callable[[], None] | None = None,
) -> LoadResult:
    """``connections`` clients, each sending ``request`` back to back, for warmup + seconds;
    only requests that both start and finish in the last ``seconds`` are counted.
    ``on_measure`` is called when the measured window opens (e.g. to read CPU counters)."""
    parts = urlsplit(url)
    address = (parts.hostname or "127.0.0.1", parts.port or 80)
    wire = request.encode(f"{address[0]}:{address[1]}")
    poller = select.epoll()
    conns: dict[int, _Conn] = {}
    latencies: list[float] = []
    errors = connects = 0
    now = time.perf_counter()
    measure_from = now + warmup
    end = measure_from + seconds

    def open_conn(started: float) -> None:
        nonlocal connects
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        code = sock.connect_ex(address)
        if code not in (0, errno.EINPROGRESS):
            sock.close()  # not OSError: the measurement cannot go on without its connections
            raise RuntimeError(f"connect to {url}: {os.strerror(code)}")
        connects += 1
        conn = _Conn(sock, started)
        conns[sock.fileno()] = conn
        poller.register(sock.fileno(), select.EPOLLOUT)

    def drop(fd: int) -> None:
        conn = conns.pop(fd)
        poller.unregister(fd)
        conn.sock.close()

    def send_request(fd: int, conn: _Conn) -> None:
        conn.sock.send(wire)  # a small request fits in an empty socket buffer
        conn.state = "reading"
        conn.parser = _ResponseParser()
        poller.modify(fd, select.EPOLLIN)

    try:
        for _ in range(connections):
            open_conn(time.perf_counter())
        measuring = False
        while True:
            now = time.perf_counter()
            if now >= end:
                break
            if not measuring and now >= measure_from:
                measuring = True
                if on_measure is not None:
                    on_measure()
            wake = end if measuring else measure_from
            for fd, _mask in poller.poll(min(0.1, wake - now)):
                conn = conns[fd]
                try:
                    if conn.state == "connecting":
                        code = conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                        if code:
                            raise OSError(code, os.strerror(code))
                        send_request(fd, conn)
                        continue
                    data = conn.sock.recv(65536)
                    if not data:
                        raise ConnectionError("closed by the server mid-response")
                    conn.parser.feed(data)
                    if not conn.parser.done:
                        continue
                    done_at = time.perf_counter()
                    if conn.started >= measure_from and done_at <= end:
                        latencies.append(done_at - conn.started)
                        if not 200 <= conn.parser.status < 300:
                            errors += 1
                    if conn.parser.close:
                        drop(fd)
                        open_conn(done_at)
                    else:
                        conn.started = done_at
                        send_request(fd, conn)
                except OSError:
                    errors += 1
                    if conns.get(fd) is conn:
                        drop(fd)
                        open_conn(time.perf_counter())
    finally:
        for fd in list(conns):
            drop(fd)
        poller.close()
    latencies.sort()
    return LoadResult(len(latencies), errors, seconds, latencies, connects)


# --- wrk ----------------------------------------------------------------------------------------

_WRK_SCRIPT = """
wrk.method = {method}
wrk.body = {body}
{content_type}
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("BENCH-RESULT %d %d %d %d %.1f %.1f\\n", summary.requests,
    summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(99)))
end
"""


def _lua_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def run_wrk(
    url: str,
    request: HttpRequest,
    connections: int,
    seconds: float,
    warmup: float,
    on_measure: Callable[[], None] | None = None,
) -> LoadResult:
    """The same measurement with ``wrk`` (its own latency percentiles, microsecond steps)."""
    wrk = shutil.which("wrk")
    assert wrk is not None
    content_type = 'wrk.headers["Content-Type"] = "application/json"' if request.body else ""
    script = _WRK_SCRIPT.format(
        method=_lua_string(request.method),
        body=_lua_string(request.body.decode()) if request.body else "nil",
        content_type=content_type,
    )
    threads = max(1, min(connections, 2))
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as lua:
        lua.write(script)
        lua.flush()

        def wrk_run(duration: float) -> str:
            argv = [wrk, f"-t{threads}", f"-c{connections}", f"-d{max(1, round(duration))}s",
                    "-s", lua.name, url + request.path]  # fmt: skip
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise RuntimeError(f"wrk failed ({done.returncode}): {done.stderr.strip()}")
            return done.stdout

        if warmup > 0:
            wrk_run(warmup)
        if on_measure is not None:
            on_measure()
        out = wrk_run(seconds)
    found = re.search(r"BENCH-RESULT (\d+) (\d+) (\d+) (\d+) (\S+) (\S+)", out)
    if found is None:
        raise RuntimeError(f"unexpected wrk output:\n{out}")
    reqs, micros, broken, bad_status = (int(found.group(i)) for i in range(1, 5))
    result = LoadResult(reqs, broken + bad_status, micros / 1e6, [], connects=-1)
    result.p50_s, result.p99_s = float(found.group(5)) / 1e6, float(found.group(6)) / 1e6
    return result


# --- one long SSE stream ------------------------------------------------------------------------


@dataclass(frozen=True)
class SseResult:
    events: int
    first_event_s: float  # from sending the request to the first body byte
    stream_s: float  # from the first body byte to the end of the stream
    status: int

    @property
    def events_per_s(self) -> float:
        """Over the whole request: a late first event (the child's time to first token varies
        by tens of ms on a busy machine) must not inflate the rate of the catch-up burst."""
        total = self.first_event_s + self.stream_s
        return self.events / total if total > 0 else 0.0


def stream_events(url: str, request: HttpRequest, timeout: float = 120.0) -> SseResult:
    """Send ``request`` and read its event stream to the end, counting ``data:`` events."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        parser = _ResponseParser(keep_body=True)
        t0 = time.perf_counter()
        sock.sendall(request.encode(f"{host}:{port}"))
        while not parser.done:
            data = sock.recv(262144)
            if not data:
                break  # a Content-Length-less close also ends a stream
            parser.feed(data)
        t1 = time.perf_counter()
    body = b"".join(parser.body)
    events = sum(1 for line in body.split(b"\n") if line.startswith(b"data: "))
    first = parser.first_body_at or t1
    return SseResult(events, first - t0, t1 - first, parser.status)
