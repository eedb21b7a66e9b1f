"""httptools (llhttp) vs h11 on troupe's hot path: parsing a proxied request and a
child's answer, per message, in this process (no sockets: the parsers alone).

    .venv/bin/python bench/parsers.py [--n 20000]

Cases: the client's ``POST /tokenize`` (head and a small JSON body), a child's
``/tokenize`` answer (Content-Length), and one SSE event of a chunked stream (how
the relay follows a child's body: llhttp watches the bytes go by; h11 must hand
each chunk over as an event).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import h11
import httptools

BODY = b'{"model":"bench-tiny","content":"hello"}'
REQUEST = (
    b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: wrk\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(BODY), BODY)
)
RESPONSE = (
    b"HTTP/1.1 200 OK\r\nServer: llama.cpp\r\nAccess-Control-Allow-Origin: \r\n"
    b"Content-Type: application/json; charset=utf-8\r\nContent-Length: 18\r\n"
    b"Keep-Alive: timeout=5, max=100\r\n\r\n"
    b'{"tokens":[1,2,3]}'
)
EVENT = b'data: {"content":"tok","stop":false,"id_slot":0,"tokens_predicted":1}\n\n'
CHUNK = b"%x\r\n%b\r\n" % (len(EVENT), EVENT)
STREAM_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)


class _Proto:
    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.done = False
        self.body: list[bytes] = []

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        self.done = True


def llhttp_request(n: int) -> None:
    proto = _Proto()
    parser = httptools.HttpRequestParser(proto)
    for _ in range(n):
        proto.headers = []
        parser.feed_data(REQUEST)
        assert proto.done


def h11_request(n: int) -> None:
    conn = h11.Connection(h11.SERVER)
    for _ in range(n):
        conn.receive_data(REQUEST)
        while True:
            event = conn.next_event()
            if isinstance(event, h11.EndOfMessage):
                break
        conn.send(h11.Response(status_code=200, headers=[("content-length", "0")]))
        conn.send(h11.EndOfMessage())
        conn.start_next_cycle()


def llhttp_response(n: int) -> None:
    proto = _Proto()
    parser = httptools.HttpResponseParser(proto)
    for _ in range(n):
        proto.headers = []
        parser.feed_data(RESPONSE)
        assert proto.done


def h11_response(n: int) -> None:
    conn = h11.Connection(h11.CLIENT)
    for _ in range(n):
        conn.send(
            h11.Request(
                method="POST", target="/tokenize", headers=[("host", "x"), ("content-length", "0")]
            )
        )
        conn.send(h11.EndOfMessage())
        conn.receive_data(RESPONSE)
        while not isinstance(conn.next_event(), h11.EndOfMessage):
            pass
        conn.start_next_cycle()


def llhttp_event(n: int) -> None:
    proto = _Proto()
    parser = httptools.HttpResponseParser(proto)
    parser.feed_data(STREAM_HEAD)
    for _ in range(n):
        parser.feed_data(CHUNK)
    proto.body.clear()


def h11_event(n: int) -> None:
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("host", "x")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(STREAM_HEAD)
    conn.next_event()
    for _ in range(n):
        conn.receive_data(CHUNK)
        while conn.next_event() is not h11.NEED_DATA:
            pass


def per_call_us(fn: Callable[[int], None], n: int) -> float:
    fn(max(1, n // 10))  # warm-up
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        fn(n)
        best = min(best, time.perf_counter() - t0)
    return best / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20000)
    n = ap.parse_args().n
    print(f"{'case':<34}{'httptools us':>14}{'h11 us':>10}{'h11/httptools':>15}")
    for label, fast, slow in (
        ("client request (head + body)", llhttp_request, h11_request),
        ("child answer (Content-Length)", llhttp_response, h11_response),
        ("one SSE event of a chunked body", llhttp_event, h11_event),
    ):
        a, b = per_call_us(fast, n), per_call_us(slow, n)
        print(f"{label:<34}{a:>14.2f}{b:>10.2f}{b / a:>14.1f}x")


if __name__ == "__main__":
    main()
