"""The router/child protocol of llama-server.

The child writes ``cmd_child_to_router:state:{json}`` lines on stdout (its logs go
to stderr) and reads ``cmd_router_to_child:exit`` on stdin; it exits on stdin EOF.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator
from typing import Any

import attrs
import trio

__all__ = [
    "EXIT_COMMAND",
    "MAX_LINE",
    "STATE_PREFIX",
    "StateLine",
    "iter_lines",
    "parse_state_line",
]

STATE_PREFIX = "cmd_child_to_router:state:"
EXIT_COMMAND = b"cmd_router_to_child:exit\n"
MAX_LINE = 1 << 20  # upstream discards a partial line beyond 1 MiB


@attrs.frozen
class StateLine:
    state: str  # "loading", "ready", "sleeping", "downloading"; others are ignored later
    payload: Any


def parse_state_line(line: str) -> StateLine | None:
    """A state line's content, or None for anything else (a log line, bad JSON)."""
    if not line.startswith(STATE_PREFIX):
        return None
    try:
        data = json.loads(line[len(STATE_PREFIX) :])
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("state"), str):
        return None
    return StateLine(data["state"], data.get("payload"))


async def iter_lines(stream: trio.abc.ReceiveStream) -> AsyncGenerator[str, None]:
    """Decoded lines of ``stream`` (without the newline); a last partial line included.

    A line longer than `MAX_LINE` is dropped rather than buffered without bound.
    """
    buf = bytearray()
    dropping = False
    while True:
        chunk = await stream.receive_some(65536)
        if not chunk:
            break
        buf += chunk
        while True:
            nl = buf.find(b"\n")
            if nl < 0:
                break
            line = bytes(buf[:nl])
            del buf[: nl + 1]
            if dropping:
                dropping = False
                continue
            yield line.rstrip(b"\r").decode("utf-8", "replace")
        if len(buf) > MAX_LINE:
            buf.clear()
            dropping = True
    if buf and not dropping:
        yield bytes(buf).rstrip(b"\r").decode("utf-8", "replace")
