"""`SlotMap`: which conversation each slot of one child holds, and which slots are busy.

The map is the only writer of its slots' records, and every change is a plain method
call with no ``await`` in it: a claim is chosen and marked busy in one step, and given
back (`SlotMap.release`) in a ``finally`` that cannot be interrupted. What spans awaits
(saving the slot's old conversation, restoring the new one) happens under a claim, so
no other request can choose that slot meanwhile; a claim given back after an error or
a cancellation leaves its slot's content unknown, never attributed to a conversation.

A conversation is known by its ``X-Conversation-Id`` when the client sends one, else by
what its request says (the prompt, or the messages): a request continues the
conversation of the idle slot whose last request's text it extends (sharing at least
half of that text).
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import trio

__all__ = ["Claim", "SlotMap", "request_text"]

MIN_SHARED_CHARS = 256  # about 64 tokens: a shorter shared beginning is not a conversation


def request_text(request: dict[str, Any]) -> str:
    """What a request says, as text that grows with its conversation: a completion's
    prompt, a chat's messages one after another (the next turn extends it)."""
    if isinstance(request.get("messages"), list):
        return "".join(json.dumps(m, sort_keys=True) for m in request["messages"])
    prompt = request.get("prompt")
    return prompt if isinstance(prompt, str) else json.dumps(prompt)


def _shared(a: str, b: str) -> int:
    """The length of the beginning ``a`` and ``b`` share (slices compare at C speed)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


@attrs.define
class _Slot:
    id: int
    conv: str = ""  # X-Conversation-Id of the conversation it holds ("": none given)
    text: str | None = ""  # its last request's text ("": empty slot; None: unknown content)
    busy: bool = False
    last_used: float = 0.0
    tokens: int | None = None  # the tokens it holds, when its last answer said (timings)


@attrs.frozen
class Claim:
    """One request's hold on a slot, until `SlotMap.release`."""

    slot: int
    own: bool  # the slot holds this request's conversation already: nothing to move
    evict: bool  # it holds another conversation (or something unknown): save it first


class SlotMap:
    """One child's slots. ``keeps``: the child keeps an idle slot's cells (troupe gave it
    ``--no-cache-idle-slots``); otherwise its engine clears idle slots when a task starts,
    and only slots that never served are claimed (a restore into them is all there is).
    A slot known to hold fewer than ``min_tokens`` is taken without a save (the store
    would not keep it: cheaper to compute again than the save's round trip)."""

    def __init__(
        self, ids: list[int], served: set[int], keeps: bool = True, min_tokens: int = 0
    ) -> None:
        self.keeps = keeps
        self.min_tokens = min_tokens
        # A slot that served before the map existed holds something we cannot name.
        self._slots = {i: _Slot(i, text=None if i in served else "") for i in ids}
        self._freed = trio.Event()

    def choose(self, conv: str, text: str) -> Claim | None:
        """The slot for a request (``conv`` may be ""), marked busy; None when every slot is
        busy (or, without ``keeps``, when none is empty)."""
        idle = [s for s in self._slots.values() if not s.busy]
        own = self._own(idle, conv, text) if self.keeps else None
        if own is not None:
            return self._take(own, conv, text, own=True)
        empty = [s for s in idle if s.text == ""]
        if empty:
            return self._take(empty[0], conv, text, own=False)
        if not self.keeps or not idle:
            return None
        return self._take(min(idle, key=lambda s: s.last_used), conv, text, own=False)

    @staticmethod
    def _own(idle: list[_Slot], conv: str, text: str) -> _Slot | None:
        if conv:
            return next((s for s in idle if s.conv == conv), None)
        best: tuple[int, _Slot] | None = None
        for s in idle:
            if not s.text or s.conv:
                continue
            shared = _shared(s.text, text)
            ours = shared >= MIN_SHARED_CHARS and 2 * shared >= len(s.text)
            if ours and (best is None or shared > best[0]):
                best = (shared, s)
        return best[1] if best else None

    def _take(self, s: _Slot, conv: str, text: str, own: bool) -> Claim:
        small = s.tokens is not None and s.tokens < self.min_tokens
        claim = Claim(s.id, own=own, evict=not own and s.text != "" and not small)
        s.busy = True
        s.conv, s.text, s.tokens = conv, text, None  # its size: unknown until it answers
        s.last_used = trio.current_time()
        return claim

    async def claim(self, conv: str, text: str) -> Claim | None:
        """`choose`, waiting while every slot is busy (the engine would queue the request
        too). None without ``keeps`` and no empty slot: the request is not steered."""
        while True:
            got = self.choose(conv, text)
            if got is not None or not self.keeps:
                return got
            await self._freed.wait()

    def release(self, claim: Claim, answered: bool, tokens: int | None = None) -> None:
        """The request left its slot, which now holds ``tokens`` (None: not said). Not
        ``answered`` (never sent, cut short): what the slot holds is unknown."""
        s = self._slots[claim.slot]
        s.busy = False
        s.last_used = trio.current_time()
        s.tokens = tokens if answered else None
        if not answered:
            s.conv, s.text = "", None
        self._freed.set()
        self._freed = trio.Event()

    def overwritten(self, slot: int) -> None:
        """A request the map did not place (its own ``id_slot``) used ``slot``."""
        s = self._slots.get(slot)
        if s is not None and not s.busy:
            s.conv, s.text, s.tokens = "", None, None
