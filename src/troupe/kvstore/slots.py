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

Requests wait for a slot in arrival order (`SlotMap.claim`): a slot given back goes at
once to the oldest waiting request (its conversation's slot when that is idle, else the
one freed), never to a later arrival, as the engine's own queue serves them with the
store off. A request never waits for one particular slot while another is idle (the
bound on waiting for a remembered slot is zero: a busy slot would cost it a whole other
request's time, taking another costs at most a save and a restore). A request that names
its own ``id_slot`` holds that slot busy in the map while it runs (`SlotMap.outside`), so
no request is sent to a slot the engine is busy with, to wait in the engine's queue for
it while later requests take the other slots.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
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
    tenant: str | None = ""  # whose tokens it holds (the key's name; None: unknown)
    outside: int = 0  # requests the map did not place (their own id_slot) running on it
    # (``private``) busy while a request the engine placed itself ran: unknown once released
    tainted: bool = False
    # Whose request the engine's own description of the slot (GET /slots: the last task's
    # prompt size, parameters) is about ("": none ran; None: unknown). While a claim runs
    # it still says the one before, until the claimant's request starts on it.
    shown: str | None = ""
    claims: int = 0  # requests placed on it so far (`SlotMap.stamp`)


@attrs.frozen
class Claim:
    """One request's hold on a slot, until `SlotMap.release`."""

    slot: int
    own: bool  # the slot holds this request's conversation already: nothing to move
    evict: bool  # it holds another conversation (or something unknown): save it first
    # (``private``) it may hold another tenant's tokens: this request must not reuse them
    foreign: bool = False
    owner: str | None = ""  # the tenant whose conversation ``evict`` saves (None: unknown)


@attrs.define(eq=False)
class _Waiter:
    """A request waiting for a slot (`SlotMap.claim`); ``claim`` is set as it is handed one."""

    conv: str
    text: str
    tenant: str
    ready: trio.Event = attrs.field(factory=trio.Event)
    claim: Claim | None = None


class SlotMap:
    """One child's slots. ``keeps``: the child keeps an idle slot's cells (troupe gave it
    ``--no-cache-idle-slots``); otherwise its engine clears idle slots when a task starts,
    and only slots that never served are claimed (a restore into them is all there is).
    A slot known to hold fewer than ``min_tokens`` is taken without a save (the store
    would not keep it: cheaper to compute again than the save's round trip).

    ``private`` (several named keys): each slot also records whose tokens it holds (the
    request's ``tenant``); a request continues only its own tenant's conversation, and a
    slot that may hold another tenant's tokens is claimed ``foreign``."""

    def __init__(
        self,
        ids: list[int],
        served: set[int],
        keeps: bool = True,
        min_tokens: int = 0,
        private: bool = False,
    ) -> None:
        self.keeps = keeps
        self.min_tokens = min_tokens
        self.private = private
        unknown = None if private else ""
        # A slot that served before the map existed holds something we cannot name.
        self._slots = {
            i: _Slot(
                i,
                text=None if i in served else "",
                tenant=unknown if i in served else "",
                shown=unknown if i in served else "",
            )
            for i in ids
        }
        self._waiting: deque[_Waiter] = deque()  # requests waiting for a slot, oldest first
        self._loose = 0  # (``private``) requests running that the engine places itself

    def choose(self, conv: str, text: str, tenant: str = "") -> Claim | None:
        """The slot for a request (``conv`` may be ""), marked busy; None when every slot is
        busy (or, without ``keeps``, when none is empty)."""
        idle = [s for s in self._slots.values() if not s.busy and not s.outside]
        mine = [s for s in idle if s.tenant == tenant] if self.private else idle
        own = self._own(mine, conv, text) if self.keeps else None
        if own is not None:
            return self._take(own, conv, text, tenant, own=True)
        empty = [s for s in idle if s.text == ""]
        if empty:
            return self._take(empty[0], conv, text, tenant, own=False)
        if not self.keeps or not idle:
            return None
        lru = min(idle, key=lambda s: s.last_used)
        return self._take(lru, conv, text, tenant, own=False)

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

    def _take(self, s: _Slot, conv: str, text: str, tenant: str, own: bool) -> Claim:
        small = s.tokens is not None and s.tokens < self.min_tokens
        foreign = self.private and s.text != "" and s.tenant != tenant
        claim = Claim(
            s.id,
            own=own,
            evict=not own and s.text != "" and not small,
            foreign=foreign,
            owner=s.tenant,
        )
        s.busy = True
        s.claims += 1
        s.conv, s.text, s.tokens = conv, text, None  # its size: unknown until it answers
        s.tenant = tenant
        s.last_used = trio.current_time()
        return claim

    async def claim(self, conv: str, text: str, tenant: str = "") -> Claim | None:
        """`choose`, waiting while every slot is busy (the engine would queue the request
        too), behind every request that waited before it. None without ``keeps`` and no
        empty slot: the request is not steered."""
        if not self._waiting:
            got = self.choose(conv, text, tenant)
            if got is not None or not self.keeps:
                return got
        waiter = _Waiter(conv, text, tenant)
        self._waiting.append(waiter)
        try:
            await waiter.ready.wait()
        except BaseException:
            if waiter.claim is None:
                self._waiting.remove(waiter)
            else:  # handed a slot as it left: given back, its content now unknown
                self.release(waiter.claim, answered=False)
            raise
        assert waiter.claim is not None
        return waiter.claim

    def release(self, claim: Claim, answered: bool, tokens: int | None = None) -> None:
        """The request left its slot, which now holds ``tokens`` (None: not said). Not
        ``answered`` (never sent, cut short): what the slot holds is unknown."""
        s = self._slots[claim.slot]
        s.busy = False
        s.last_used = trio.current_time()
        s.tokens = tokens if answered else None
        s.shown = s.tenant
        if not answered:
            # Never sent, or cut short: the slot may still hold what it held before.
            s.conv, s.text = "", None
            s.tenant = s.shown = None if self.private else ""
        if s.outside or s.tainted or self._loose:
            # A request the map did not place ran on it meanwhile, or may have.
            s.conv, s.text, s.tokens = "", None, None
            s.tenant = s.shown = None if self.private else ""
        s.tainted = False
        self._hand_over()

    def _hand_over(self) -> None:
        """Idle slots to the requests waiting for one, oldest first."""
        while self._waiting:
            first = self._waiting[0]
            got = self.choose(first.conv, first.text, first.tenant)
            if got is None:
                return
            self._waiting.popleft()
            first.claim = got
            first.ready.set()

    @contextmanager
    def outside(self, slot: int) -> Iterator[None]:
        """A request the map did not place (its own ``id_slot``) runs on ``slot`` for the
        block: the slot is busy meanwhile (the engine queues any other task sent to it),
        and its content unknown after."""
        s = self._slots.get(slot)
        if s is None:
            yield
            return
        s.outside += 1
        s.claims += 1
        s.conv, s.text, s.tokens = "", None, None
        s.tenant = s.shown = None if self.private else ""
        try:
            yield
        finally:
            s.outside -= 1
            s.last_used = trio.current_time()
            self._hand_over()

    @contextmanager
    def loose(self) -> Iterator[None]:
        """(``private``) A request the map does not place (a route it does not steer, a
        body too large to read, several tasks) runs for the block, on whichever idle slot
        the engine picks: the content of every slot idle meanwhile is unknown after it
        (whose tokens, whose task GET /slots describes), and of every slot busy meanwhile
        too (the engine may pick it between its request's end and its release)."""
        if not self.private:
            yield
            return
        self._loose += 1
        self._taint()
        try:
            yield
        finally:
            self._loose -= 1
            self._taint()

    def _taint(self) -> None:
        for s in self._slots.values():
            if s.busy:
                s.tainted = True
            else:
                s.conv, s.text, s.tokens = "", None, None
                s.tenant = s.shown = None

    def shows(self, slot: int, tenant: str) -> bool:
        """Whether what the engine says of ``slot`` (its last or current task) can be only
        about ``tenant``'s own requests: the slot holds theirs, and (while claimed) the
        request before the claim was theirs too."""
        s = self._slots.get(slot)
        if s is None or not tenant or s.outside:
            return False
        return s.shown == tenant and (not s.busy or s.tenant == tenant)

    def stamp(self, slot: int) -> tuple[int, str | None] | None:
        """How many requests ``slot`` was placed on so far and whose tokens it holds: the
        same stamp later means no request was placed on it meanwhile (a request the
        engine placed itself makes its owner unknown)."""
        s = self._slots.get(slot)
        return None if s is None else (s.claims, s.tenant)

    def owner(self, slot: int) -> str | None:
        """Whose tokens ``slot`` holds ("" without ``private``; None: unknown)."""
        s = self._slots.get(slot)
        return None if s is None else s.tenant
