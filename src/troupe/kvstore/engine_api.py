"""The few calls the KV store makes to a child: ``GET /slots``, a slot's save and
restore, ``/tokenize`` and ``/apply-template``. One connection per call, closed after
it (never the relay's pool: these run beside a stop, when the pool forgets the child).
"""

from __future__ import annotations

import json
from typing import Any

import trio

__all__ = ["EngineCallFailed", "call", "fetch"]

_MAX_ANSWER = 64 << 20


class EngineCallFailed(Exception):
    """The child answered with an error, or not in a way we can read."""


def _dechunk(body: bytes) -> bytes:
    out = bytearray()
    while body:
        size_line, _, rest = body.partition(b"\r\n")
        size = int(size_line.split(b";")[0] or b"0", 16)
        if size == 0:
            break
        out += rest[:size]
        body = rest[size + 2 :]
    return bytes(out)


async def call(port: int, method: str, path: str, payload: Any = None) -> Any:
    """``method path`` on the child at ``port`` with a JSON body; its JSON answer.
    Raises `EngineCallFailed` on an error status, OSError when it cannot be reached."""
    status, content = await fetch(port, method, path, payload)
    try:
        answer = json.loads(content) if content else None
    except ValueError:
        raise EngineCallFailed(f"{path}: answer is not JSON") from None
    if status >= 400:
        message = answer.get("error", answer) if isinstance(answer, dict) else answer
        raise EngineCallFailed(f"{path}: {status} {message}")
    return answer


async def fetch(port: int, method: str, path: str, payload: Any = None) -> tuple[int, bytes]:
    """``method path`` on the child at ``port`` with a JSON body: its status and body,
    whatever they are. Raises `EngineCallFailed` on an unreadable answer, OSError when
    it cannot be reached."""
    body = b"" if payload is None else json.dumps(payload).encode()
    head = (
        f"{method} {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nconnection: close\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()
    data = bytearray()
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        async with stream:
            await stream.send_all(head + body)
            while len(data) < _MAX_ANSWER:
                chunk = await stream.receive_some(1 << 16)
                if not chunk:
                    break
                data += chunk
    except trio.BrokenResourceError as exc:  # the child went away mid-call
        raise EngineCallFailed(f"{path}: connection lost: {exc}") from None
    header, sep, content = bytes(data).partition(b"\r\n\r\n")
    if not sep:
        raise EngineCallFailed(f"{path}: no answer")
    lines = header.split(b"\r\n")
    try:
        status = int(lines[0].split()[1])
    except (IndexError, ValueError):
        raise EngineCallFailed(f"{path}: unreadable answer") from None
    if any(
        line.lower().startswith(b"transfer-encoding:") and b"chunked" in line.lower()
        for line in lines[1:]
    ):
        content = _dechunk(content)
    return status, content
