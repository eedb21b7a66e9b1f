"""The conversation of one session: ordered items, kept by troupe.

It lives in troupe, not in the child: a model evicted between two responses loses
only its KV cache, and the next response sends the whole conversation again.
"""

from __future__ import annotations

from typing import Any

from troupe.realtime.events import RealtimeError
from troupe.realtime.items import item_size

__all__ = ["Conversation"]

Item = dict[str, Any]
ROOT = "root"  # previous_item_id that means "at the start"


class Conversation:
    def __init__(self, max_items: int, max_bytes: int) -> None:
        self.max_items = max_items
        self.max_bytes = max_bytes
        self._order: list[str] = []
        self._items: dict[str, Item] = {}
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._order)

    def items(self) -> list[Item]:
        return [self._items[i] for i in self._order]

    def last_id(self) -> str | None:
        return self._order[-1] if self._order else None

    def get(self, item_id: str) -> Item:
        item = self._items.get(item_id)
        if item is None:
            raise _not_found(item_id)
        return item

    def check_room(self, item: Item) -> None:
        """Raise the error a new ``item`` gets when the conversation is full."""
        if item["id"] in self._items:
            raise RealtimeError(
                f"an item with id {item['id']!r} already exists",
                code="item_id_exists",
                param="item.id",
            )
        if len(self._order) >= self.max_items:
            raise RealtimeError(
                f"the conversation is full ({self.max_items} items): delete some items first",
                code="conversation_too_long",
            )
        if self._bytes + item_size(item) > self.max_bytes:
            raise RealtimeError(
                f"the conversation would exceed {self.max_bytes >> 20} MiB: "
                "delete some items first",
                code="conversation_too_large",
            )

    def add(
        self, item: Item, previous_item_id: str | None = None, *, check: bool = True
    ) -> str | None:
        """Insert ``item`` after ``previous_item_id`` (at the end when None; at the start
        for "root"); returns the id of the item now before it. ``check=False``: a
        response's own output, whose room was checked when it started."""
        if check:
            self.check_room(item)
        if previous_item_id is None:
            index = len(self._order)
        elif previous_item_id == ROOT:
            index = 0
        elif previous_item_id in self._items:
            index = self._order.index(previous_item_id) + 1
        else:
            raise RealtimeError(
                f"previous_item_id {previous_item_id!r} is not in the conversation",
                code="item_not_found",
                param="previous_item_id",
            )
        self._order.insert(index, item["id"])
        self._items[item["id"]] = item
        self._bytes += item_size(item)
        return self._order[index - 1] if index else None

    def replace(self, item: Item) -> None:
        """Store a newer state of an item already in the conversation (a response's)."""
        old = self._items.get(item["id"])
        if old is not None:
            self._bytes += item_size(item) - item_size(old)
            self._items[item["id"]] = item

    def delete(self, item_id: str) -> None:
        item = self.get(item_id)
        self._order.remove(item_id)
        del self._items[item_id]
        self._bytes -= item_size(item)


def _not_found(item_id: str) -> RealtimeError:
    return RealtimeError(
        f"item {item_id!r} is not in the conversation", code="item_not_found", param="item_id"
    )
