"""`serve_realtime`: a WebSocket upgrade checked like any request, then a session.

Order as llama.cpp's middleware: 503 until ready, the API key, the route (404), the
model (resolved and validated exactly like a POST's). A refusal is an HTTP answer
with upstream's JSON error body, so a client sees the same error as for a request.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from functools import partial
from typing import Protocol
from urllib.parse import parse_qsl

import trio

from troupe.api import JSON_TYPE, strip_prefix
from troupe.assembly import Troupe
from troupe.catalog import ModelEntry
from troupe.http import access
from troupe.http.errors import NOT_FOUND_BODY, failure_body, middleware_error_body
from troupe.http.keys import tenant_of
from troupe.http.models_json import architecture_of
from troupe.http.respond import retry_after
from troupe.lease import autoload_flag, validate_model
from troupe.ops.access import AccessRecord
from troupe.realtime.config import SessionConfig
from troupe.realtime.events import RealtimeError
from troupe.realtime.lease import ChildCall
from troupe.realtime.session import Connection, Keepalive, Limits, Session, SessionModel
from troupe.sched import Failure

__all__ = ["REALTIME_PATHS", "WebSocketRequest", "serve_realtime"]

log = logging.getLogger("troupe.realtime")

REALTIME_PATHS = frozenset({"/v1/realtime", "/realtime"})
KEY_SUBPROTOCOL = "openai-insecure-api-key."  # how browsers send a key (no headers there)
LIMITS = Limits()  # per session: conversation length and size, buffered audio
PING_INTERVAL = 20.0  # seconds between pings (at most half --ws-idle-timeout)
Headers = list[tuple[bytes, bytes]]


class WebSocketRequest(Protocol):
    """trio-websocket's server-side ``WebSocketRequest``."""

    @property
    def path(self) -> str: ...

    @property
    def headers(self) -> Headers: ...

    @property
    def proposed_subprotocols(self) -> Sequence[str]: ...

    async def accept(
        self, *, subprotocol: str | None = None, extra_headers: Headers | None = None
    ) -> Connection: ...

    async def reject(
        self, status_code: int, *, extra_headers: Headers | None = None, body: bytes | None = None
    ) -> None: ...


def _header(headers: Headers, name: bytes) -> str | None:
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def client_key(request: WebSocketRequest) -> str | None:
    """The API key the client sent: Authorization, X-Api-Key, or the browser subprotocol."""
    given = _header(request.headers, b"authorization") or _header(request.headers, b"x-api-key")
    if given:
        return given.removeprefix("Bearer ")
    for proto in request.proposed_subprotocols:
        if proto.startswith(KEY_SUBPROTOCOL):
            return proto[len(KEY_SUBPROTOCOL) :]
    return None


def model_modalities(ctx: Troupe, entry: ModelEntry) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The catalog's modalities, replaced by what the child reported once loaded."""
    arch = architecture_of(entry, ctx.scheduler.snapshot.models.get(entry.name))
    return tuple(arch["input_modalities"]), tuple(arch["output_modalities"])


async def _reject(
    request: WebSocketRequest, status: int, body: bytes, extra: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    headers = [(b"content-type", JSON_TYPE.encode()), (b"server", b"llama.cpp"), *extra]
    await request.reject(status, extra_headers=headers, body=body)


async def _ping(conn: Connection) -> None:
    ping = getattr(conn, "ping", None)  # trio-websocket's; waits for the pong
    if ping is not None:
        await ping()


async def serve_realtime(ctx: Troupe, request: WebSocketRequest) -> None:
    """Serve one WebSocket upgrade: refuse it as HTTP, or run a realtime session; either
    way one access record (kind "realtime") when it ends."""
    started = trio.current_time()
    rec = access.realtime_record(ctx, access.UPGRADE_CLIENT.get(), request.path, started)
    try:
        await _serve(ctx, request, rec)
    finally:
        access.finish_realtime(ctx, rec, started)


async def _serve(ctx: Troupe, request: WebSocketRequest, rec: AccessRecord) -> None:
    path, _, query = request.path.partition("?")
    params: dict[str, str] = {}
    for key, value in parse_qsl(query, keep_blank_values=True):
        params.setdefault(key, value)
    rec.model = params.get("model", "")

    async def reject(
        status: int, message: str, body: bytes, extra: Sequence[tuple[bytes, bytes]] = ()
    ) -> None:
        rec.status, rec.error = status, message
        await _reject(request, status, body, extra)

    if not ctx.ready:
        body = middleware_error_body("Loading model", "unavailable_error", 503)
        await reject(503, "Loading model", body)
        return
    api_key = client_key(request)
    keys = ctx.tenants.current
    caller = keys.match(api_key or "") if keys else None
    if keys and caller is None:
        log.warning("unauthorized: Invalid API Key")
        body = middleware_error_body("Invalid API Key", "authentication_error", 401)
        await reject(401, "Invalid API Key", body)
        return
    key_name = "" if caller is None else caller.name
    rec.tenant = tenant_of(keys, key_name)
    if strip_prefix(path, ctx.settings.api_prefix) not in REALTIME_PATHS:
        await reject(404, "File Not Found", NOT_FOUND_BODY)
        return
    intent = params.get("intent", "")
    if intent not in ("", "transcription"):
        failure = Failure.bad_request(f"unknown intent '{intent}'")
        await reject(400, failure.message, failure_body(failure))
        return
    autoload = autoload_flag(params, ctx.settings.models_autoload)
    checked = validate_model(ctx, params.get("model", ""), autoload, key_name)
    if isinstance(checked, Failure):
        await reject(checked.status, checked.message, failure_body(checked), retry_after(checked))
        return
    entry = checked
    rec.model, rec.catalogd = entry.name, True
    subprotocol = "realtime" if "realtime" in request.proposed_subprotocols else None
    conn = await request.accept(subprotocol=subprotocol)
    rec.status = 101
    kind = "transcription" if intent else "realtime"
    config = SessionConfig(kind=kind, model=entry.name)
    if kind == "transcription":
        config = SessionConfig(kind=kind, model=entry.name, transcription={"model": entry.name})
    model = SessionModel(
        name=entry.name,
        names=frozenset({entry.name, *entry.aliases, params["model"]}),
        modalities=partial(model_modalities, ctx, entry),
    )
    call = ChildCall(
        ctx, entry.name, autoload, api_key if ctx.settings.api_keys else None, rec.tenant
    )
    idle = ctx.settings.ws_idle_timeout
    keep = Keepalive(ping=partial(_ping, conn), interval=min(PING_INTERVAL, idle / 2), idle=idle)
    session = Session(conn, model, call, config, LIMITS, stop=ctx.http_stop, keepalive=keep)
    try:
        await session.run()
    except Exception:
        # One_for_one: a bug here ends this session, with an error, and nothing else.
        log.exception("realtime session for %s failed", entry.name)
        rec.error = "internal error in troupe's realtime session"
        error = RealtimeError("internal error in troupe's realtime session", type_="server_error")
        with contextlib.suppress(Exception):  # the client may be gone already
            await session.emit_error(error)
            await conn.aclose(1011, "internal error")
    finally:
        rec.prompt_tokens, rec.completion_tokens = session.tokens
        rec.bytes_in, rec.bytes_out = session.bytes_in, session.bytes_out
        rec.close_code = _close_code(conn)


def _close_code(conn: Connection) -> int | None:
    """The WebSocket close code, once either side has closed (trio-websocket's)."""
    closed = getattr(conn, "closed", None)
    code = getattr(closed, "code", None)
    return code if isinstance(code, int) else None
