"""What raising HAProxy's ``tune.bufsize`` costs, so the balancer could read a ``model``
that follows 200 KB of messages itself: HAProxy's RSS with many requests part-way
through a long body (``option http-buffer-request`` holds a buffer for each), at the
default 16 KB and at 256 KB. troupe keeps the default and has the node a long request
lands on forward it (bench/cluster.py measures that forward).

    .venv/bin/python bench/haproxy_bufsize.py [--clients N]
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from troupe_rig.cluster import HAPROXY
from troupe_rig.engine_process import free_port
from troupe_rig.reaper import guard

CONFIG = """global
    maxconn 5000
    tune.bufsize {bufsize}
defaults
    mode http
    timeout client 60s
    timeout server 60s
    timeout connect 1s
    timeout http-request 60s
frontend f
    bind 127.0.0.1:{port}
    option http-buffer-request
    http-request set-var(txn.model) req.body,json_query('$.model')
    default_backend b
backend b
    server s 127.0.0.1:{dead}
"""


def rss_mib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024
    return 0


def measure(directory: Path, bufsize: int, clients: int, body: int, sent: int) -> str:
    port = free_port()
    config = directory / f"haproxy-{bufsize}.cfg"
    config.write_text(CONFIG.format(bufsize=bufsize, port=port, dead=free_port()))
    proc = subprocess.Popen(
        [str(HAPROXY), "-db", "-f", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    guard(proc.pid)  # killed if the bench is
    socks: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", port)).close()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"haproxy did not start ({config})") from None
                time.sleep(0.05)
        idle = rss_mib(proc.pid)
        head = (
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % body
        )
        start = b'{"messages":[{"role":"user","content":"'
        part = head + start + b"x" * (sent - len(start))
        for _ in range(clients):
            s = socket.create_connection(("127.0.0.1", port))
            s.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                s.send(part)
            socks.append(s)
        time.sleep(1.5)  # HAProxy reads what each sent; nothing to wait on from outside
        used = rss_mib(proc.pid)
    finally:
        for s in socks:
            s.close()
        proc.terminate()
        proc.wait()
    each = (used - idle) * 1024 // max(1, clients)
    return (
        f"  tune.bufsize {bufsize:>7}: RSS {idle} MiB idle, {used} MiB with {clients} "
        f"requests {sent // 1000} KB into their bodies (+{each} KiB each)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=1000)
    args = parser.parse_args()
    print(f"HAProxy ({HAPROXY}), {args.clients} clients each 250 KB into a 300 KB JSON body")
    with tempfile.TemporaryDirectory(prefix="bench-bufsize-") as tmp:
        for bufsize in (16384, 262144):
            print(measure(Path(tmp), bufsize, args.clients, 300_000, 250_000))
    return 0


if __name__ == "__main__":
    sys.exit(main())
