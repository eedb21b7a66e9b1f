"""Free TCP ports for children, as upstream picks them (bind :0, read it, close)."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    # There is a small race between closing the socket and the child binding it;
    # upstream has the same window. A child that loses it exits and is reported.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
