"""The ``openai`` SDK's realtime client for tests and benchmarks, with strict checks.

The SDK is asyncio (its WebSocket library is ``websockets``); troupe runs on Trio. A
scenario is an asyncio coroutine run in a worker thread with its own event loop
(`run_asyncio`), against a troupe serving in the caller's Trio run.

`validate` is stricter than the SDK's own parsing (which builds models unchecked): an
event must validate against ``openai.types.realtime.RealtimeServerEvent``, and carry
no field those models do not define.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import trio
import trio_websocket
from openai import AsyncOpenAI
from openai.resources.realtime.realtime import AsyncRealtimeConnection
from openai.types.realtime import RealtimeServerEvent
from pydantic import BaseModel, TypeAdapter

__all__ = ["EventLog", "raw_socket", "run_asyncio", "sdk_client", "validate"]

T = TypeVar("T")

_SERVER_EVENT: TypeAdapter[RealtimeServerEvent] = TypeAdapter(RealtimeServerEvent)
# Beyond the GA schema on purpose: the beta API's session temperature (GA dropped it,
# a local model still takes it).
ALLOWED_EXTRAS = frozenset({"session.temperature"})


def _extras(value: object, path: str) -> Iterator[str]:
    """The paths of fields no SDK model defines (``session.temperature``, ...)."""
    if isinstance(value, BaseModel):
        for key in value.model_extra or {}:
            name = f"{path}.{key}" if path else key
            if name not in ALLOWED_EXTRAS:
                yield name
        for key in type(value).model_fields:
            yield from _extras(getattr(value, key), f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _extras(item, f"{path}[{i}]")


def validate(raw: str | bytes) -> RealtimeServerEvent:
    """Parse one server event with the SDK's types; AssertionError for unknown fields."""
    event = _SERVER_EVENT.validate_json(raw)
    unknown = list(_extras(event, ""))
    assert not unknown, f"{event.type}: fields the SDK's types do not define: {unknown} in {raw!r}"
    return event


def sdk_client(base_url: str, api_key: str = "none") -> AsyncOpenAI:
    """``AsyncOpenAI(base_url=.../v1)``: the SDK then connects to ``ws://.../v1/realtime``."""
    return AsyncOpenAI(base_url=base_url.rstrip("/") + "/v1", api_key=api_key, max_retries=0)


class EventLog:
    """Every event a connection received, validated, in order."""

    def __init__(self, conn: AsyncRealtimeConnection, timeout: float = 60.0) -> None:
        self.conn = conn
        self.timeout = timeout
        self.events: list[RealtimeServerEvent] = []

    async def next(self) -> Any:
        raw = await asyncio.wait_for(self.conn.recv_bytes(), self.timeout)
        event = validate(raw)
        self.events.append(event)
        return event

    async def until(self, kind: str) -> list[Any]:
        """The events up to and including the next one of type ``kind``."""
        got = []
        while True:
            event = await self.next()
            got.append(event)
            if event.type == kind:
                return got

    async def send(self, event: dict[str, Any]) -> None:
        await self.conn.send(event)  # type: ignore[arg-type]


@asynccontextmanager
async def raw_socket(
    router_url: str,
    resource: str,
    subprotocols: Sequence[str] = (),
    headers: list[tuple[bytes, bytes]] | None = None,
    max_message_size: int = 1 << 20,
) -> AsyncIterator[trio_websocket.WebSocketConnection]:
    """A plain WebSocket client (a browser's view: subprotocols, no SDK)."""
    port = int(router_url.rsplit(":", 1)[1])
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    # We own the TCP stream: trio-websocket does not close a client's socket itself.
    async with stream, trio.open_nursery() as nursery:
        ws = await trio_websocket.wrap_client_stream(
            nursery,
            stream,
            "127.0.0.1",
            resource,
            subprotocols=list(subprotocols) or None,
            extra_headers=headers,
            max_message_size=max_message_size,
        )
        yield ws
        await ws.aclose()


async def run_asyncio(scenario: Callable[..., Awaitable[T]], *args: object) -> T:
    """Run the asyncio coroutine function ``scenario(*args)`` in a thread of its own."""

    def run() -> T:
        return asyncio.run(scenario(*args))  # type: ignore[arg-type]

    return await trio.to_thread.run_sync(run)
