"""The child side of llama-server's router protocol, and llama.cpp-style logs.

In child mode (``LLAMA_SERVER_ROUTER_PORT`` set) the real engine keeps its
original stdout as a private *command channel* and points fd 1 at stderr, so
state lines are the only thing on stdout and every log goes to stderr. The fake
does the same, so a supervisor reading its pipes sees what it would see with the
real engine.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping

__all__ = [
    "CMD_EXIT",
    "CMD_STATE_PREFIX",
    "CommandChannel",
    "dumps",
    "is_child",
    "log",
    "log_raw",
    "srv",
]

CMD_STATE_PREFIX = "cmd_child_to_router:state:"
CMD_EXIT = "cmd_router_to_child:exit"
ROUTER_PORT_ENV = "LLAMA_SERVER_ROUTER_PORT"


def dumps(value: object) -> str:
    """JSON like llama.cpp's ``safe_json_to_str``: compact, UTF-8, insertion order."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def is_child(environ: Mapping[str, str] | None = None) -> bool:
    """llama.cpp checks only that the variable exists; its value is not used."""
    return ROUTER_PORT_ENV in (os.environ if environ is None else environ)


_T0 = time.monotonic()


def log_raw(text: str) -> None:
    """Write to stderr in one call, so lines from concurrent tasks never interleave."""
    os.write(2, text.encode("utf-8", "replace"))


def log(text: str, level: str = "I") -> None:
    """A line as llama.cpp's logger prints it: ``M.ss.mmm.uuu L text``."""
    us = int((time.monotonic() - _T0) * 1e6)
    stamp = f"{us // 60_000_000}.{us // 1_000_000 % 60:02d}.{us // 1000 % 1000:03d}.{us % 1000:03d}"
    log_raw(f"{stamp} {level} {text}\n")


def srv(func: str, message: str, level: str = "I") -> None:
    """``SRV_INF``: ``srv  %12.*s: message`` (the function name cut to 12 characters)."""
    log(f"srv  {func[:12]:>12}: {message}", level)


class CommandChannel:
    """Where state lines go: the reserved original stdout in child mode, else nowhere."""

    def __init__(self, fd: int | None) -> None:
        self._fd = fd

    @classmethod
    def reserve(cls, child: bool) -> CommandChannel:
        """Mirror ``server_reserve_stdout``: keep stdout for commands, logs to stderr."""
        if not child:
            return cls(None)
        sys.stdout.flush()
        fd = os.dup(1)  # Python's dup is close-on-exec already, like the engine's
        os.dup2(2, 1)
        return cls(fd)

    @property
    def active(self) -> bool:
        return self._fd is not None

    def notify(self, state: str, payload: object) -> None:
        if self._fd is None:
            return
        line = f"{CMD_STATE_PREFIX}{dumps({'state': state, 'payload': payload})}\n"
        data = line.encode()
        while data:  # a pipe may take a long line in parts
            try:
                n = os.write(self._fd, data)
            except BrokenPipeError:
                return  # the router is gone; stdin EOF will end us
            data = data[n:]
