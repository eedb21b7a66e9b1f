"""Conversation items: a client's item checked and put in the server's shape.

Messages (system, user, assistant), function calls and their outputs. Audio and
image parts are accepted only for a model whose input modalities include them, so a
client learns at once, not at its next response, that the model cannot hear or see.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from troupe.realtime.events import RealtimeError, new_id

__all__ = ["item_from_client", "item_size"]

Item = dict[str, Any]

_PARTS = {
    "system": {"input_text"},
    "user": {"input_text", "input_audio", "input_image"},
    "assistant": {"output_text", "output_audio"},
}
_PART_KEYS = {
    "input_text": {"type", "text"},
    "output_text": {"type", "text"},
    "input_audio": {"type", "audio", "transcript"},
    "output_audio": {"type", "audio", "transcript"},
    "input_image": {"type", "image_url", "detail"},
}
_STATUSES = ("completed", "incomplete", "in_progress")


def _fail(message: str, param: str) -> RealtimeError:
    return RealtimeError(message, code="invalid_value", param=param)


def _string(data: dict[str, Any], key: str, where: str, *, required: bool = True) -> str | None:
    value = data.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str):
        raise _fail(f"{where}.{key} must be a string", f"{where}.{key}")
    return value


def item_from_client(data: object, modalities: tuple[str, ...], model: str) -> Item:
    """The server's copy of a client item (``conversation.item.create``), with an id."""
    where = "item"
    if not isinstance(data, dict):
        raise _fail("item must be an object", where)
    kind = data.get("type")
    item_id = data.get("id")
    if item_id is not None and (not isinstance(item_id, str) or not item_id):
        raise _fail("item.id must be a non-empty string", "item.id")
    status = data.get("status", "completed")
    if status not in _STATUSES:
        raise _fail(f"item.status must be one of {', '.join(_STATUSES)}", "item.status")
    base: Item = {"id": item_id or new_id("item"), "object": "realtime.item", "type": kind}
    if kind == "message":
        out = _message(data, modalities, model)
        known = {"id", "object", "type", "status", "role", "content"}
    elif kind == "function_call":
        out = {
            "status": status,
            "call_id": _string(data, "call_id", where, required=False) or new_id("call"),
            "name": _string(data, "name", where),
            "arguments": _string(data, "arguments", where),
        }
        known = {"id", "object", "type", "status", "call_id", "name", "arguments"}
    elif kind == "function_call_output":
        out = {"call_id": _string(data, "call_id", where), "output": _string(data, "output", where)}
        known = {"id", "object", "type", "status", "call_id", "output"}
    else:
        raise _fail(
            f"item.type {kind!r} is not supported: use message, function_call or "
            "function_call_output",
            "item.type",
        )
    unknown = sorted(set(data) - known)
    if unknown:
        raise _fail(f"item.{unknown[0]} is not a field of a {kind} item", f"item.{unknown[0]}")
    return {**base, "status": status, **out}


def _message(data: dict[str, Any], modalities: tuple[str, ...], model: str) -> Item:
    role = data.get("role")
    if role not in _PARTS:
        raise _fail("item.role must be user, system or assistant", "item.role")
    content = data.get("content")
    if not isinstance(content, list):
        raise _fail("item.content must be a list of content parts", "item.content")
    parts = []
    for i, part in enumerate(content):
        where = f"item.content[{i}]"
        if not isinstance(part, dict):
            raise _fail(f"{where} must be an object", where)
        kind = part.get("type")
        if role == "assistant" and kind == "text":
            kind = "output_text"  # the beta API's spelling
        if kind not in _PARTS[role]:
            allowed = ", ".join(sorted(_PARTS[role]))
            raise _fail(f"{where}.type must be one of {allowed} in a {role} message", where)
        unknown = sorted(set(part) - _PART_KEYS[kind])
        if unknown:
            raise _fail(f"{where}.{unknown[0]} is not a field of {kind}", f"{where}.{unknown[0]}")
        parts.append(_part(kind, part, where, modalities, model))
    return {"role": role, "content": parts}


def _part(
    kind: str, part: dict[str, Any], where: str, modalities: tuple[str, ...], model: str
) -> dict[str, Any]:
    if kind in ("input_text", "output_text"):
        return {"type": kind, "text": _string(part, "text", where)}
    if kind == "input_image":
        if "image" not in modalities:
            raise RealtimeError(
                f"model {model} does not take images (its input is {', '.join(modalities)})",
                code="unsupported_modality",
                param=f"{where}.type",
            )
        url = _string(part, "image_url", where)
        if not (url or "").startswith("data:image/"):
            raise _fail(f"{where}.image_url must be a data:image/... URL", f"{where}.image_url")
        return {"type": kind, "image_url": url, "detail": part.get("detail") or "auto"}
    audio = _string(part, "audio", where, required=False)
    transcript = _string(part, "transcript", where, required=False)
    if audio is not None:
        if kind == "input_audio" and "audio" not in modalities:
            raise RealtimeError(
                f"model {model} does not take audio (its input is {', '.join(modalities)})",
                code="unsupported_modality",
                param=f"{where}.audio",
            )
        try:
            base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise _fail(f"{where}.audio must be base64", f"{where}.audio") from None
    elif transcript is None:
        raise _fail(f"{where} needs audio or a transcript", where)
    return {"type": kind, "audio": audio, "transcript": transcript}


def item_size(item: Item) -> int:
    """Roughly the bytes an item holds (for the conversation's size limit)."""
    size = len(item.get("arguments") or "") + len(item.get("output") or "")
    for part in item.get("content") or ():
        for key in ("text", "audio", "transcript", "image_url"):
            size += len(part.get(key) or "")
    return size + 64
