"""Client events: each checked and carried out, or answered with an ``error`` event.

A bad event never ends the session: whatever it lacks is named in the error, and
the next event is handled as if it had not come.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from troupe.realtime import item_events
from troupe.realtime.config import RESPONSE_KEYS, Updater
from troupe.realtime.events import RealtimeError
from troupe.realtime.items import item_from_client
from troupe.realtime.response import ResponseRun, ResponseSpec

if TYPE_CHECKING:
    from troupe.realtime.session import Session

__all__ = ["handle_event", "parse_message"]

Event = dict[str, Any]
Handler = Callable[["Session", Event], Awaitable[None]]

_RESPONSE_FIELDS = RESPONSE_KEYS | {"conversation", "input", "metadata"}


def parse_message(message: str | bytes) -> tuple[Event, str | None]:
    """A client message as an event object and its ``event_id``; `RealtimeError` when
    it is not one."""
    if isinstance(message, bytes):
        raise RealtimeError(
            "binary messages are not events: send each event as a JSON text message",
            code="invalid_event",
        )
    try:
        data = json.loads(message)
    except ValueError as exc:
        raise RealtimeError(f"the message is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise RealtimeError("an event must be a JSON object", code="invalid_event")
    event_id = data.get("event_id")
    if not isinstance(data.get("type"), str):
        raise RealtimeError(
            "the event has no 'type'", code="missing_required_parameter", param="type"
        )
    return data, event_id if isinstance(event_id, str) else None


async def handle_event(session: Session, message: str | bytes) -> None:
    event_id: str | None = None
    try:
        data, event_id = parse_message(message)
        handler = _HANDLERS.get(data["type"])
        if handler is None:
            raise RealtimeError(
                f"Invalid value: {data['type']!r}. Supported values are: "
                + ", ".join(f"'{name}'" for name in _HANDLERS),
                code="invalid_value",
                param="type",
            )
        await handler(session, data)
    except RealtimeError as error:
        await session.emit_error(error, event_id)


def _updater(session: Session) -> Updater:
    _inputs, outputs = session.model.modalities()
    return Updater(session.model.name, session.model.names, outputs)


async def session_update(session: Session, data: Event) -> None:
    updater = _updater(session)
    session.config = updater.session(session.config, data.get("session"))
    error = updater.error("session.update")
    if error is not None:
        await session.emit_error(error, data.get("event_id"))
    await session.emit({"type": "session.updated", "session": session.config.to_json()})


async def response_create(session: Session, data: Event) -> None:
    if session.config.kind == "transcription":
        raise RealtimeError(
            "a transcription session does not create responses", code="invalid_session_type"
        )
    running = session.response
    if running is not None:
        raise RealtimeError(
            f"Conversation already has an active response in progress: {running.id}. Wait "
            "until the response is finished before creating a new one.",
            code="conversation_already_has_active_response",
        )
    spec = _response_spec(session, data.get("response") or {})
    conversation = session.conversation
    if spec.into_conversation:
        conversation.check_room({"id": "", "content": []})  # room for at least the answer

    def added(item: Event) -> str | None:
        return conversation.add(item, check=False)

    run = ResponseRun(spec, session.call, session.emit, added, conversation.replace)
    session.response = run

    async def respond() -> None:
        try:
            await run.run()
        finally:
            session.response = None
            session.count_usage(run.out.usage)

    session.start(respond)


def _response_spec(session: Session, params: object) -> ResponseSpec:
    if not isinstance(params, dict):
        raise RealtimeError("response must be an object", code="invalid_value", param="response")
    updater = _updater(session)
    config = updater.response(session.config.response, params, "response")
    for key in sorted(set(params) - _RESPONSE_FIELDS):
        updater.fault(f"response.{key}", "unknown or unsupported field")
    target = params.get("conversation", "auto")
    if target not in ("auto", "none"):
        updater.fault("response.conversation", "must be 'auto' or 'none'")
    metadata = params.get("metadata")
    if metadata is not None and not (
        isinstance(metadata, dict)
        and len(metadata) <= 16
        and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    ):
        updater.fault("response.metadata", "must map at most 16 strings to strings")
    error = updater.error("response.create")
    if error is not None:
        raise error
    into = target == "auto"
    if "input" in params:
        context = _response_input(session, params["input"])
    else:
        context = session.conversation.items()
    return ResponseSpec(
        config=config,
        context=context,
        into_conversation=into,
        metadata=metadata,
        conversation_id=session.conversation_id if into else None,
        input_format=session.config.input_format,
    )


def _response_input(session: Session, value: object) -> list[Event]:
    """``response.input``: the items this response sees instead of the conversation;
    ``item_reference`` entries name conversation items."""
    if not isinstance(value, list):
        raise RealtimeError("response.input must be a list", code="invalid_value")
    inputs, _ = session.model.modalities()
    items = []
    for entry in value:
        if isinstance(entry, dict) and entry.get("type") == "item_reference":
            items.append(session.conversation.get(str(entry.get("id"))))
        else:
            items.append(item_from_client(entry, inputs, session.model.name))
    return items


async def response_cancel(session: Session, data: Event) -> None:
    running = session.response
    if running is None:
        raise RealtimeError(
            "Cancellation failed: no active response found", code="response_cancel_not_active"
        )
    wanted = data.get("response_id")
    if wanted is not None and wanted != running.id:
        raise RealtimeError(
            f"Cancellation failed: response {wanted!r} is not the active response",
            code="response_cancel_not_active",
            param="response_id",
        )
    running.cancel()


async def output_audio_clear(session: Session, data: Event) -> None:
    raise RealtimeError(
        "output_audio_buffer.clear is for WebRTC and SIP sessions; troupe answers in text",
        code="unsupported_event",
    )


_HANDLERS: dict[str, Handler] = {
    "session.update": session_update,
    "conversation.item.create": item_events.item_create,
    "conversation.item.retrieve": item_events.item_retrieve,
    "conversation.item.delete": item_events.item_delete,
    "conversation.item.truncate": item_events.item_truncate,
    "response.create": response_create,
    "response.cancel": response_cancel,
    "input_audio_buffer.append": item_events.audio_append,
    "input_audio_buffer.commit": item_events.audio_commit,
    "input_audio_buffer.clear": item_events.audio_clear,
    "output_audio_buffer.clear": output_audio_clear,
}
