"""Client events on the conversation (``conversation.item.*``) and the input audio
buffer (``input_audio_buffer.*``)."""

from __future__ import annotations

import base64
from typing import TYPE_CHECKING, Any

from troupe.realtime.audio import duration_ms
from troupe.realtime.events import RealtimeError, new_id, public_item
from troupe.realtime.items import item_from_client
from troupe.realtime.transcribe import transcribe

if TYPE_CHECKING:
    from troupe.realtime.session import Session

__all__ = [
    "audio_append",
    "audio_clear",
    "audio_commit",
    "item_create",
    "item_delete",
    "item_retrieve",
    "item_truncate",
]

Event = dict[str, Any]


def _item_id(data: Event) -> str:
    item_id = data.get("item_id")
    if not isinstance(item_id, str):
        raise RealtimeError(
            "item_id is required", code="missing_required_parameter", param="item_id"
        )
    return item_id


async def _added(session: Session, item: Event, previous: str | None) -> None:
    shown = public_item(item)
    await session.emit(
        {"type": "conversation.item.added", "previous_item_id": previous, "item": shown}
    )
    await session.emit(
        {"type": "conversation.item.done", "previous_item_id": previous, "item": shown}
    )


async def item_create(session: Session, data: Event) -> None:
    inputs, _ = session.model.modalities()
    item = item_from_client(data.get("item"), inputs, session.model.name)
    previous = data.get("previous_item_id")
    if previous is not None and not isinstance(previous, str):
        raise RealtimeError(
            "previous_item_id must be a string", code="invalid_value", param="previous_item_id"
        )
    before = session.conversation.add(item, previous)
    await _added(session, item, before)


async def item_retrieve(session: Session, data: Event) -> None:
    item = session.conversation.get(_item_id(data))
    await session.emit({"type": "conversation.item.retrieved", "item": item})


async def item_delete(session: Session, data: Event) -> None:
    item_id = _item_id(data)
    session.conversation.delete(item_id)
    await session.emit({"type": "conversation.item.deleted", "item_id": item_id})


async def item_truncate(session: Session, data: Event) -> None:
    """Cut an assistant message's audio at what the user heard, and drop its transcript
    (the model must not believe it said what was never played)."""
    item_id = _item_id(data)
    item = session.conversation.get(item_id)
    index, end_ms = data.get("content_index"), data.get("audio_end_ms")
    if item.get("role") != "assistant":
        raise RealtimeError(
            "only assistant messages can be truncated", code="invalid_value", param="item_id"
        )
    parts = item["content"]
    if not isinstance(index, int) or not 0 <= index < len(parts):
        raise RealtimeError(
            "content_index is not a part of the item", code="invalid_value", param="content_index"
        )
    part = parts[index]
    if part.get("audio") is None:
        raise RealtimeError(
            "only audio content can be truncated (this part is text)",
            code="invalid_value",
            param="content_index",
        )
    audio = base64.b64decode(part["audio"])
    fmt = session.config.input_format
    total = duration_ms(len(audio), fmt)
    if not isinstance(end_ms, int) or not 0 <= end_ms <= total:
        raise RealtimeError(
            f"audio_end_ms must be from 0 to the audio's length ({total:.0f} ms)",
            code="invalid_value",
            param="audio_end_ms",
        )
    keep = int(len(audio) * end_ms / total) if total else 0
    keep -= keep % (2 if fmt == "audio/pcm" else 1)
    cut = {**part, "audio": base64.b64encode(audio[:keep]).decode("ascii"), "transcript": ""}
    session.conversation.replace({**item, "content": [*parts[:index], cut, *parts[index + 1 :]]})
    await session.emit(
        {
            "type": "conversation.item.truncated",
            "item_id": item_id,
            "content_index": index,
            "audio_end_ms": end_ms,
        }
    )


def _audio_model(session: Session) -> None:
    inputs, _ = session.model.modalities()
    if "audio" not in inputs:
        raise RealtimeError(
            f"model {session.model.name} does not take audio input (its input is "
            f"{', '.join(inputs)}); send text with conversation.item.create",
            code="unsupported_modality",
        )


async def audio_append(session: Session, data: Event) -> None:
    _audio_model(session)
    session.audio.append(data.get("audio"))


async def audio_clear(session: Session, data: Event) -> None:
    _audio_model(session)
    session.audio.clear()
    await session.emit({"type": "input_audio_buffer.cleared"})


async def audio_commit(session: Session, data: Event) -> None:
    _audio_model(session)
    fmt = session.config.input_format
    audio = session.audio.take(fmt)
    content = {"type": "input_audio", "audio": base64.b64encode(audio).decode(), "transcript": None}
    item = {
        "id": new_id("item"),
        "object": "realtime.item",
        "type": "message",
        "role": "user",
        "status": "completed",
        "content": [content],
    }
    before = session.conversation.add(item)
    event = {"type": "input_audio_buffer.committed", "previous_item_id": before}
    await session.emit({**event, "item_id": item["id"]})
    await _added(session, item, before)
    options = session.config.transcription
    if session.config.kind == "transcription" or options is not None:
        seconds = duration_ms(len(audio), fmt) / 1000

        async def run() -> None:
            await _transcribe(session, item, audio, options or {}, seconds)

        session.start(run)


async def _transcribe(
    session: Session, item: Event, audio: bytes, options: dict[str, Any], seconds: float
) -> None:
    base = {"item_id": item["id"], "content_index": 0}
    try:
        text = await transcribe(session.call, audio, session.config.input_format, options)
    except RealtimeError as error:
        failure = {"type": error.type, "message": error.message, "code": error.code}
        event = {"type": "conversation.item.input_audio_transcription.failed", **base}
        await session.emit({**event, "error": failure})
        return
    part = {**item["content"][0], "transcript": text}
    session.conversation.replace({**item, "content": [part]})
    usage = {"type": "duration", "seconds": round(seconds, 3)}
    event = {"type": "conversation.item.input_audio_transcription.completed", **base}
    await session.emit({**event, "transcript": text, "usage": usage})
