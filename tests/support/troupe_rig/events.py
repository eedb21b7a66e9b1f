"""Reading /models/sse events in tests, from `Scheduler.subscribe`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

__all__ = ["collect_until", "drain"]

Event = dict[str, Any]


def drain(channel: trio.MemoryReceiveChannel[Event]) -> list[Event]:
    """Every event already delivered, without waiting."""
    out: list[Event] = []
    while True:
        try:
            out.append(channel.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel):
            return out


async def collect_until(
    channel: trio.MemoryReceiveChannel[Event],
    last: Callable[[Event], bool],
    *,
    upstream_only: bool = True,
) -> list[Event]:
    """Events up to and including the first for which ``last`` is true; troupe's own
    ``troupe_*`` events are left out unless ``upstream_only`` is False."""
    out: list[Event] = []
    async for event in channel:
        if upstream_only and event["event"].startswith("troupe_"):
            continue
        out.append(event)
        if last(event):
            return out
    return out
