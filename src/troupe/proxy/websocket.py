"""The WebSocket bridge: a client session pumped to and from its model's child.

``/v1/realtime?model=...`` (and any proxied path a client upgrades) holds a lease for
the whole session, so the model counts as busy and is never evicted under it. Two
tasks pump messages; when one side closes, the other is closed with the same code
(or 1000/1011 where the code cannot be sent). Errors before the handshake is
accepted are answered as HTTP (upstream-shaped JSON) through the ASGI denial
response, so a client gets the same error as for a plain request.
"""

from __future__ import annotations

import logging

import trio
import trio_websocket

from troupe.actors.scheduler import ModelUnavailable
from troupe.http.asgi import Receive, Scope, Send, query_params
from troupe.http.context import RouterContext
from troupe.http.errors import JSON_TYPE, failure_body
from troupe.http.proxy_routes import acquire_within, autoload_flag, retry_after, validate_model
from troupe.sched import Failure, Grant

__all__ = ["bridge_websocket"]

log = logging.getLogger("troupe.websocket")

CLOSE_GRACE = 1.0
_FORWARD_HEADERS = (b"authorization", b"x-api-key", b"openai-beta", b"x-conversation-id")
_UNSENDABLE = {1005, 1006, 1015}  # reserved codes: never sent in a close frame


async def _deny(
    send: Send,
    status: int,
    body: bytes,
    content_type: str = JSON_TYPE,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    await send(
        {
            "type": "websocket.http.response.start",
            "status": status,
            "headers": [
                (b"content-type", content_type.encode()),
                (b"server", b"llama.cpp"),
                *(headers or []),
            ],
        }
    )
    await send({"type": "websocket.http.response.body", "body": body})


def _sendable(code: int | None, default: int) -> int:
    if code is None or code in _UNSENDABLE or not (1000 <= code <= 4999):
        return default
    return code


async def bridge_websocket(ctx: RouterContext, scope: Scope, receive: Receive, send: Send) -> None:
    first = await receive()
    if first["type"] != "websocket.connect":
        return
    name = query_params(scope).get("model", "")
    autoload = autoload_flag(scope, ctx.settings.models_autoload)
    checked = validate_model(ctx, name, autoload)
    if isinstance(checked, Failure):
        await _deny(send, checked.status, failure_body(checked))
        return
    leased: list[tuple[int, Grant]] = []
    failed: list[Failure] = []
    async with trio.open_nursery() as nursery:

        async def client_gone() -> None:
            await receive()  # before the handshake, only a disconnect can arrive
            nursery.cancel_scope.cancel()  # the wait leaves the queue

        nursery.start_soon(client_gone)
        try:
            leased.append(
                await acquire_within(ctx, checked.name, autoload=autoload, update_last_used=True)
            )
        except ModelUnavailable as exc:
            failed.append(exc.failure)
        nursery.cancel_scope.cancel()
    if failed:
        await _deny(send, failed[0].status, failure_body(failed[0]), headers=retry_after(failed[0]))
        return
    if not leased:
        return  # the client left while waiting
    rid, grant = leased[0]
    try:
        await _bridge(ctx, scope, receive, send, grant.port)
    finally:
        await ctx.scheduler.release(rid)


async def _bridge(
    ctx: RouterContext, scope: Scope, receive: Receive, send: Send, port: int
) -> None:
    path = scope.get("raw_path", b"").decode("latin-1") or scope["path"]
    query = scope.get("query_string", b"").decode("latin-1")
    resource = path + (f"?{query}" if query else "")
    extra = [(k, v) for k, v in scope["headers"] if k in _FORWARD_HEADERS]
    limit = ctx.settings.ws_max_message_bytes
    try:
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    except OSError as exc:
        await _deny(send, 500, failure_body(Failure.server_error(f"proxy error: {exc}")))
        return
    # We own the TCP stream: trio-websocket does not close its socket when the server
    # closes first.
    async with stream, trio.open_nursery() as nursery:
        try:
            upstream = await trio_websocket.wrap_client_stream(
                nursery,
                stream,
                "127.0.0.1",
                resource,
                subprotocols=scope.get("subprotocols") or None,
                extra_headers=extra,
                max_message_size=limit,
            )
        except trio_websocket.ConnectionRejected as exc:
            await _deny(send, exc.status_code, exc.body or b"", _content_type(exc))
            return
        except (trio_websocket.HandshakeError, trio.BrokenResourceError, OSError) as exc:
            log.warning("websocket to the child failed: %s", exc)
            body = failure_body(Failure.server_error(f"proxy error: {exc}"))
            await _deny(send, 500, body)
            return
        await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})
        try:
            await _pump(receive, send, upstream)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_GRACE):
                await upstream.aclose(1001)


async def _pump(receive: Receive, send: Send, upstream: trio_websocket.WebSocketConnection) -> None:
    async with trio.open_nursery() as pumps:

        async def client_to_child() -> None:
            while True:
                msg = await receive()
                if msg["type"] == "websocket.disconnect":
                    code = _sendable(msg.get("code"), 1000)
                    with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_GRACE):
                        await upstream.aclose(code, msg.get("reason") or None)
                    pumps.cancel_scope.cancel()
                    return
                data = msg.get("text") if msg.get("text") is not None else msg.get("bytes")
                if data is None:
                    continue
                try:
                    await upstream.send_message(data)
                except trio_websocket.ConnectionClosed:
                    return  # the other pump sees the close and ends the session

        async def child_to_client() -> None:
            try:
                while True:
                    data = await upstream.get_message()
                    key = "text" if isinstance(data, str) else "bytes"
                    await send({"type": "websocket.send", key: data})
            except trio_websocket.ConnectionClosed as closed:
                reason = closed.reason
                code = _sendable(reason.code if reason else None, 1011)
                await send(
                    {
                        "type": "websocket.close",
                        "code": code,
                        "reason": (reason.reason or "") if reason else "",
                    }
                )
                pumps.cancel_scope.cancel()

        pumps.start_soon(client_to_child)
        pumps.start_soon(child_to_client)


def _content_type(exc: trio_websocket.ConnectionRejected) -> str:
    for key, value in exc.headers or []:
        if key.lower() == b"content-type":
            return str(value.decode("latin-1"))
    return JSON_TYPE
