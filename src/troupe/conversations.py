"""The conversation tracker: ``X-Conversation-Id`` -> the model serving it (upstream's tickets).

Each POST carrying the header is remembered with a fresh ticket before it waits for
its model; a newer request for the same conversation, or ``DELETE /v1/stream``,
invalidates the ticket. A request waiting under a ticket is not cancelled by its
client going away (a page reload must not cancel the load), only by such a stop,
which cancels the wait's scope at once rather than after the load (upstream only
checks after). Upstream's entries never expire; here the table is bounded (the ids are
chosen by clients, so an unbounded table is a memory leak anyone can drive): past
`MAX_CONVERSATIONS` the least recently used entries not waiting are forgotten.

The tickets are not the scheduler's; they live here because nothing in
the model table depends on them (the scheduler only sees the lease a ticket waits for),
and this tracker, like the table, has a single writer: the HTTP handlers, on one Trio
thread, with no await between reading and changing an entry. The composition root
(`troupe.assembly`) builds it, the handlers share it: so it sits below both.

Each entry belongs to the tenant that created it (``owner``: the name of its API key
when several keys are configured, "" otherwise; `troupe.http.keys.tenant_of`). The
table is keyed by (owner, id): another tenant's id is, to every method, an id that does
not exist (the same dict lookup, the same answer), and a request of another tenant
with the same id neither replaces nor cancels the owner's. A child keeps each stream
by the id it was sent, so it is sent `child_id` (the owner's name, which has no ``:``,
then ``:`` and the id): two tenants' streams of the same id never meet in a child.
"""

from __future__ import annotations

import itertools

import attrs
import trio

__all__ = ["MAX_CONVERSATIONS", "ConversationTracker", "child_id", "from_child_id"]

MAX_CONVERSATIONS = 10_000


def child_id(conv_id: str, owner: str) -> str:
    """The id ``owner``'s conversation ``conv_id`` has in a child (the same id with no
    owner: one tenant)."""
    return f"{owner}:{conv_id}" if owner else conv_id


def from_child_id(found: str, owner: str) -> str | None:
    """The client's id of a child's ``found`` when it is ``owner``'s, else None."""
    if not owner:
        return found
    prefix = owner + ":"
    return found[len(prefix) :] if found.startswith(prefix) else None


@attrs.define
class _Entry:
    model: str
    ticket: int
    scope: trio.CancelScope | None = None


_Key = tuple[str, str]  # (owner, conversation id)


class ConversationTracker:
    def __init__(self, limit: int = MAX_CONVERSATIONS) -> None:
        self._entries: dict[_Key, _Entry] = {}  # oldest first (re-inserted on use)
        self._tickets = itertools.count(1)
        self._limit = limit

    def remember(self, conv_id: str, model: str, *, owner: str) -> int:
        """A new ticket for ``owner``'s ``conv_id`` (replacing, and cancelling, any older
        wait of the same owner's)."""
        key = (owner, conv_id)
        self._cancel(key)
        self._entries.pop(key, None)
        ticket = next(self._tickets)
        self._entries[key] = _Entry(model, ticket)
        if len(self._entries) > self._limit:
            self._trim()
        return ticket

    def _trim(self) -> None:
        for old in list(self._entries):
            if len(self._entries) <= self._limit:
                return
            if self._entries[old].scope is None:  # a waiting request keeps its entry
                del self._entries[old]

    def attach(self, conv_id: str, ticket: int, scope: trio.CancelScope, *, owner: str) -> None:
        """The wait of ``ticket`` runs in ``scope``; a stop cancels it."""
        entry = self._entries.get((owner, conv_id))
        if entry is not None and entry.ticket == ticket:
            entry.scope = scope

    def detach(self, conv_id: str, ticket: int, *, owner: str) -> None:
        entry = self._entries.get((owner, conv_id))
        if entry is not None and entry.ticket == ticket:
            entry.scope = None

    def alive(self, conv_id: str, ticket: int, *, owner: str) -> bool:
        entry = self._entries.get((owner, conv_id))
        return entry is not None and entry.ticket == ticket

    def lookup(self, conv_id: str, *, owner: str) -> str | None:
        """The model serving ``owner``'s ``conv_id`` (None: unknown, or another's)."""
        entry = self._entries.get((owner, conv_id))
        return entry.model if entry is not None else None

    def forget(self, conv_id: str, *, owner: str) -> None:
        key = (owner, conv_id)
        self._cancel(key)
        self._entries.pop(key, None)

    def _cancel(self, key: _Key) -> None:
        entry = self._entries.get(key)
        if entry is not None and entry.scope is not None:
            entry.scope.cancel()
            entry.scope = None

    def __len__(self) -> int:
        return len(self._entries)
