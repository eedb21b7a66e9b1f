"""Input audio: the buffer the client appends to, and transcription by the child.

Manual commit only (no server VAD): ``input_audio_buffer.commit`` turns the buffer
into a user message; in a transcription session (``?intent=transcription``), or when
``audio.input.transcription`` is set, the audio also goes to the child's
``/v1/audio/transcriptions``.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from troupe.actors.scheduler import ModelUnavailable
from troupe.proxy.upstream import UpstreamError, UpstreamResponse
from troupe.realtime.audio import duration_ms, multipart_body, to_wav
from troupe.realtime.events import RealtimeError
from troupe.realtime.lease import ChildCall
from troupe.realtime.response import child_error

__all__ = ["AudioBuffer", "transcribe"]

MIN_COMMIT_MS = 100  # the API refuses to commit less


class AudioBuffer:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._chunks: list[bytes] = []
        self.size = 0

    def append(self, audio: object) -> None:
        if not isinstance(audio, str):
            raise RealtimeError(
                "audio must be a base64 string", code="invalid_value", param="audio"
            )
        try:
            data = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise RealtimeError(
                "audio is not valid base64", code="invalid_value", param="audio"
            ) from None
        if self.size + len(data) > self.max_bytes:
            raise RealtimeError(
                f"the input audio buffer is full ({self.max_bytes >> 20} MiB): commit or clear it",
                code="input_audio_buffer_full",
            )
        self._chunks.append(data)
        self.size += len(data)

    def take(self, fmt: str) -> bytes:
        """The buffered audio (cleared), refused when shorter than the API allows."""
        ms = duration_ms(self.size, fmt)
        if ms < MIN_COMMIT_MS:
            raise RealtimeError(
                f"Error committing input audio buffer: buffer too small. Expected at least "
                f"{MIN_COMMIT_MS}ms of audio, but buffer only has {ms:.2f}ms of audio.",
                code="input_audio_buffer_commit_empty",
            )
        data = b"".join(self._chunks)
        self.clear()
        return data

    def clear(self) -> None:
        self._chunks.clear()
        self.size = 0


async def transcribe(call: ChildCall, audio: bytes, fmt: str, options: dict[str, Any]) -> str:
    """The child's transcript of ``audio``; raises `RealtimeError` with its error."""
    fields = {"model": call.model, "response_format": "json"}
    for key in ("language", "prompt"):
        if options.get(key):
            fields[key] = options[key]
    body, content_type = multipart_body(fields, to_wav(audio, fmt))
    text: list[str] = []

    async def read(upstream: UpstreamResponse) -> None:
        raw = b"".join([chunk async for chunk in upstream.chunks()])
        if upstream.status_code != 200:
            raise child_error(upstream.status_code, raw)
        try:
            text.append(str(json.loads(raw)["text"]))
        except (ValueError, KeyError, TypeError):
            raise RealtimeError(
                f"unreadable transcription from the model: {raw[:200]!r}", type_="server_error"
            ) from None

    try:
        await call.post("/v1/audio/transcriptions", body, content_type, read)
    except ModelUnavailable as exc:
        failure = exc.failure
        raise RealtimeError(failure.message, type_=failure.type, code=str(failure.status)) from None
    except UpstreamError as exc:
        raise RealtimeError(
            f"the model's server closed the connection: {exc}", type_="server_error"
        ) from None
    return text[0]
