"""A bare ASGI app with llama-server's routes and JSON shapes.

Plain ASGI rather than Quart: importing Quart costs a few hundred milliseconds,
and the fake should be ready in well under a second.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import trio

from troupe_rig.fake_engine import responses as r
from troupe_rig.fake_engine.generate import (
    count_prompt,
    detokenize,
    generate,
    requested_tokens,
    tokenize,
)
from troupe_rig.fake_engine.protocol import dumps, log, srv
from troupe_rig.fake_engine.state import EngineState, Phase

__all__ = ["FakeApp"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_JSON = b"application/json; charset=utf-8"
_SERVER = (b"server", b"llama.cpp")
_ROLE = {"role": "assistant", "content": None}  # the first chat delta, as upstream sends it
_PUBLIC = frozenset({"/health", "/v1/health"})
_OAI_COMPLETIONS = frozenset({"/completions", "/v1/completions"})
_CHAT = frozenset({"/chat/completions", "/v1/chat/completions"})
_TRANSCRIPTIONS = frozenset({"/audio/transcriptions", "/v1/audio/transcriptions"})


class BadRequest(Exception):
    """Answered 400 ``invalid_request_error``, like llama-server's ``ex_wrapper``."""


class ClientGone(Exception):
    """The client disconnected before its request body arrived: nothing to answer."""


async def send_json(send: Send, status: int, body: object) -> None:
    data = dumps(body).encode()
    headers = [_SERVER, (b"content-type", _JSON), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def send_error(send: Send, message: str, type_: str) -> None:
    status, body = r.error_body(message, type_)
    await send_json(send, status, body)


async def read_body(receive: Receive) -> bytes:
    raw = bytearray()
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            raise ClientGone
        raw += msg.get("body", b"")
        if not msg.get("more_body", False):
            return bytes(raw)


def heard(body: bytes) -> str:
    """What the fake "hears" in the WAV file of a multipart upload: its length and rate."""
    start = body.find(b"RIFF")
    if start < 0 or len(body) < start + 44:
        raise BadRequest("no WAV file in the upload")
    channels, rate = struct.unpack_from("<HI", body, start + 22)
    bits = struct.unpack_from("<H", body, start + 34)[0]
    size = struct.unpack_from("<I", body, start + 40)[0]
    ms = size / (rate * channels * bits // 8) * 1000
    return f"heard {ms:.0f} ms at {rate} Hz"


async def read_json(receive: Receive) -> dict[str, Any]:
    raw = await read_body(receive)
    try:
        body = json.loads(raw or b"{}")
    except ValueError as exc:
        raise BadRequest(f"[json.exception.parse_error] {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    return body


class FakeApp:
    def __init__(self, state: EngineState) -> None:
        self.state = state
        self.cfg = state.cfg

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
        elif scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "websocket":
            await self._websocket(scope, receive, send)

    def _route(self, scope: Scope) -> str | None:
        path: str = scope["path"]
        prefix = self.cfg.api_prefix
        if prefix:
            return path[len(prefix) :] or "/" if path.startswith(prefix) else None
        return path

    def _authorized(self, scope: Scope, path: str) -> bool:
        if not self.cfg.api_keys or path in _PUBLIC:
            return True
        headers = dict(scope["headers"])
        key = (headers.get(b"authorization") or headers.get(b"x-api-key") or b"").decode()
        return key.removeprefix("Bearer ") in self.cfg.api_keys

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = self._route(scope), scope["method"]
        if path is not None and not self._authorized(scope, path):
            body = {"error": {"message": "Invalid API Key", "type": "authentication_error",
                              "code": 401}}  # fmt: skip
            await send_json(send, 401, body)
            return
        if not self.state.ready:
            body = {"error": {"message": "Loading model", "type": "unavailable_error",
                              "code": 503}}  # fmt: skip
            await send_json(send, 503, body)
            return
        try:
            await self._dispatch(path, method, receive, send)
        except BadRequest as exc:
            await send_error(send, str(exc), "invalid_request_error")
        except ClientGone:
            pass

    async def _dispatch(self, path: str | None, method: str, receive: Receive, send: Send) -> None:
        st, cfg = self.state, self.cfg
        if method == "GET" and path in _PUBLIC:
            await send_json(send, 200, {"status": "ok"})
        elif method == "GET" and path == "/props":
            await send_json(send, 200, r.props(cfg, st.phase is Phase.SLEEPING))
        elif method == "GET" and path == "/slots":
            await send_json(send, 200, r.slots(cfg, st.slots_busy))
        elif method == "GET" and path in ("/models", "/v1/models"):
            await send_json(send, 200, r.models_list(cfg, st.info))
        elif method == "GET" and path == "/metrics":
            message = "This server does not support metrics endpoint. Start it with `--metrics`"
            await send_error(send, message, "not_supported_error")
        elif method == "POST" and path == "/tokenize":
            body = await read_json(receive)
            async with st.busy():
                await send_json(send, 200, _tokenize(body))
        elif method == "POST" and path == "/detokenize":
            body = await read_json(receive)
            tokens = [t for t in body.get("tokens", []) if isinstance(t, int)]
            async with st.busy():
                await send_json(send, 200, {"content": detokenize(tokens)})
        elif method == "POST" and path in _TRANSCRIPTIONS:
            upload = await read_body(receive)
            if not cfg.audio:
                raise BadRequest("this model does not take audio (no audio projector)")
            async with st.busy():
                await send_json(send, 200, {"text": heard(upload)})
        elif method == "POST" and (path == "/completion" or path in _OAI_COMPLETIONS | _CHAT):
            body = await read_json(receive)
            kind = "native" if path == "/completion" else "chat" if path in _CHAT else "oai"
            async with st.busy():
                await self._complete(kind, body, receive, send)
        else:
            body = {"error": {"message": "File Not Found", "type": "not_found_error",
                              "code": 404}}  # fmt: skip
            await send_json(send, 404, body)

    async def _complete(
        self, kind: str, body: dict[str, Any], receive: Receive, send: Send
    ) -> None:
        cfg = self.cfg
        if kind == "chat":
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise BadRequest("'messages' is required")
            prompt = "".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
            n_prompt = count_prompt(prompt) + 8 * len(messages)  # the template's own tokens
        else:
            if "prompt" not in body:
                raise BadRequest("[json.exception.out_of_range.403] key 'prompt' not found")
            prompt, n_prompt = str(body["prompt"]), count_prompt(body["prompt"])
        busy = self.state.slots_busy
        turn = r.Turn(kind, prompt, n_prompt, min(set(range(cfg.n_slots)) - busy, default=0))
        n_tokens = requested_tokens(body, cfg)
        busy.add(turn.slot)
        try:
            if body.get("stream"):
                await self._stream(turn, n_tokens, receive, send)
                return
            async for text, token in generate(cfg, n_tokens):
                turn.texts.append(text)
                turn.ids.append(token)
        finally:
            busy.discard(turn.slot)
        if kind == "native":
            out = r.completion_final(cfg, turn, stream=False)
        elif kind == "chat":
            out = r.chat_final(cfg, turn)
        else:
            out = r.oai_completion(cfg, turn, chunk=False, last=False)
        await send_json(send, 200, out)

    async def _stream(self, turn: r.Turn, n_tokens: int, receive: Receive, send: Send) -> None:
        cfg = self.cfg
        headers = [_SERVER, (b"x-accel-buffering", b"no"), (b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})

        async def event(*items: object) -> None:
            data = "".join(f"data: {dumps(item)}\n\n" for item in items)
            await send({"type": "http.response.body", "body": data.encode(), "more_body": True})

        finished = False
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
            async for text, token in generate(cfg, n_tokens):
                turn.texts.append(text)
                turn.ids.append(token)
                if turn.kind == "native":
                    await event(r.completion_chunk(turn))
                elif turn.kind == "oai":
                    await event(r.oai_completion(cfg, turn, chunk=True, last=False))
                else:
                    delta = {"content": text}
                    first = [r.chat_chunk(cfg, turn, _ROLE, None)] if turn.n_gen == 1 else []
                    await event(*first, r.chat_chunk(cfg, turn, delta, None))
            if turn.kind == "native":
                await event(r.completion_final(cfg, turn, stream=True))
            else:
                if turn.kind == "chat":
                    last = r.chat_chunk(cfg, turn, {}, "length")
                    last["timings"] = r.timings(turn)
                else:
                    last = r.oai_completion(cfg, turn, chunk=False, last=True)
                await event(last)
                done = b"data: [DONE]\n\n"
                await send({"type": "http.response.body", "body": done, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            finished = True
            nursery.cancel_scope.cancel()
        if not finished:  # the client went away: say so as llama-server does, and how far
            srv("stop", f"cancel task, id_task = {turn.slot}", "W")
            log(f"fake: client disconnected after {turn.n_gen} of {n_tokens} tokens")

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """llama-server has no WebSocket endpoint: any upgrade is an HTTP 404."""
        await receive()  # websocket.connect
        data = dumps(
            {"error": {"message": "File Not Found", "type": "not_found_error", "code": 404}}
        ).encode()
        headers = [_SERVER, (b"content-type", _JSON)]
        await send({"type": "websocket.http.response.start", "status": 404, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": data})


async def _cancel_on_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    # llama-server stops generating when the client goes away; so does the fake.
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


def _tokenize(body: dict[str, Any]) -> dict[str, object]:
    tokens = tokenize(str(body.get("content", "")), bool(body.get("add_special", False)))
    if not body.get("with_pieces"):
        return {"tokens": tokens}
    pieces: list[dict[str, object]] = []
    for t in tokens:
        b = t - 3
        piece: object = "<s>" if t == 1 else chr(b) if b < 128 else [b]
        pieces.append({"id": t, "piece": piece})
    return {"tokens": pieces}
