"""A stand-in child for the relay benches: it writes SSE events faster than a relay forwards.

Speaks just enough of llama-server's child protocol for troupe to spawn it (the
``ready`` state line on the reserved stdout, exit on stdin EOF); ``--help`` and
``--version`` are answered by troupe's fake engine, so troupe reads the same option
table. Every ``POST /completion`` is answered with a chunked event stream, one event
per chunk, one ``send`` per event:

* ``{"n_predict": N}``: N events back to back, as fast as the socket takes them
  (blocking sends: the relay's reads are the only limit, so the figure is the relay's);
* ``{"n_predict": N, "rate": R}``: N events at R events/s (held-open streams).

Any other request gets a small JSON answer. One thread per connection (the benches
hold at most ~1,000).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

EVENT = b'data: {"content":"tok","stop":false,"id_slot":0,"tokens_predicted":1}\n\n'
CHUNK = b"%x\r\n%b\r\n" % (len(EVENT), EVENT)
LAST = b'data: {"content":"","stop":true}\n\n'
STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nServer: llama.cpp\r\nAccess-Control-Allow-Origin: \r\n"
    b"Content-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"
    b"Keep-Alive: timeout=5\r\n\r\n"
)


def _read_request(conn: socket.socket, buf: bytearray) -> tuple[bytes, bytes] | None:
    while b"\r\n\r\n" not in buf:
        data = conn.recv(65536)
        if not data:
            return None
        buf += data
    end = buf.index(b"\r\n\r\n")
    head = bytes(buf[:end]).lower()
    del buf[: end + 4]
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip() == b"content-length":
            length = int(value)
    while len(buf) < length:
        data = conn.recv(65536)
        if not data:
            return None
        buf += data
    body = bytes(buf[:length])
    del buf[:length]
    return head.split(b"\r\n", 1)[0], body


def _stream(conn: socket.socket, n: int, rate: float) -> None:
    conn.sendall(STREAM_HEAD)
    interval = 1.0 / rate if rate > 0 else 0.0
    next_at = time.monotonic()
    for _ in range(n):
        if interval:
            next_at += interval
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        conn.sendall(CHUNK)
    last = b"%x\r\n%b\r\n0\r\n\r\n" % (len(LAST), LAST)
    conn.sendall(last)


def _serve(conn: socket.socket) -> None:
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray()
    with conn:
        try:
            while True:
                got = _read_request(conn, buf)
                if got is None:
                    return
                line, body = got
                if line.startswith(b"post /completion"):
                    params = json.loads(body or b"{}")
                    _stream(conn, int(params.get("n_predict", 100)), float(params.get("rate", 0)))
                else:
                    answer = b'{"tokens":[1,2,3]}'
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Type: application/json; charset=utf-8\r\n"
                        b"Content-Length: %d\r\n\r\n%b" % (len(answer), answer)
                    )
        except OSError:
            return


def main() -> int:
    argv = sys.argv[1:]
    if "--help" in argv or "--version" in argv or "-h" in argv:
        os.execv(sys.executable, [sys.executable, "-m", "troupe_rig.fake_engine", *argv])
    port = int(argv[argv.index("--port") + 1]) if "--port" in argv else 8080
    listener = socket.create_server(("127.0.0.1", port), backlog=4096)
    command = os.dup(1)
    os.dup2(2, 1)
    ready = {"state": "ready", "payload": {}}
    os.write(command, b"cmd_child_to_router:state:" + json.dumps(ready).encode() + b"\n")

    def watch_stdin() -> None:
        while True:
            data = os.read(0, 4096)
            if not data or b"exit" in data:
                os._exit(0)  # the router sent the exit command, or is gone (EOF)

    threading.Thread(target=watch_stdin, daemon=True).start()
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=_serve, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main())
