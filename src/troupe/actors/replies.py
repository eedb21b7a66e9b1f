"""The reply channels of everyone waiting for the scheduler's answer."""

from __future__ import annotations

import trio

from troupe.messages import ReplyChannel
from troupe.sched import Failure, Grant

__all__ = ["Replies"]


class Replies:
    def __init__(self) -> None:
        self._channels: dict[int, ReplyChannel] = {}

    def __len__(self) -> int:
        """How many askers still wait for an answer."""
        return len(self._channels)

    def expect(self, rid: int, channel: ReplyChannel) -> None:
        self._channels[rid] = channel

    def answer(self, rid: int, result: Grant | Failure | None) -> bool:
        """Send ``result`` to ``rid``'s asker (never blocks); False when the asker is gone,
        so a lease it was given must be given back."""
        channel = self._channels.pop(rid, None)
        if channel is None:
            return True
        try:
            channel.send_nowait(result)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        finally:
            channel.close()
        return True

    def drop(self, rid: int) -> None:
        """The asker gave up waiting: nobody reads its channel any more."""
        channel = self._channels.pop(rid, None)
        if channel is not None:
            channel.close()
