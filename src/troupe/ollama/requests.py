"""Ollama's request bodies as the child's: ``/api/chat`` and ``/api/generate`` become
``/v1/chat/completions`` (templated by the child, as Ollama templates them), a raw
``/api/generate`` becomes ``/completion`` and one with a ``suffix`` ``/infill``;
``/api/embed`` becomes ``/v1/embeddings``.

``options`` are Ollama's Modelfile parameters: the sampling ones go to the child under
llama.cpp's names; the load-time ones (``num_ctx``, ``num_gpu``, ...) cannot change a
running child and are returned as ignored, for the caller's warning line.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

__all__ = [
    "LOAD_OPTIONS",
    "BadRequest",
    "ChildRequest",
    "chat_request",
    "embed_request",
    "generate_request",
    "sampling",
]

Json = dict[str, Any]

# Ollama option -> llama.cpp's parameter (the child takes these in every body).
_SAMPLING = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "typical_p": "typical_p",
    "repeat_last_n": "repeat_last_n",
    "repeat_penalty": "repeat_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "mirostat": "mirostat",
    "mirostat_tau": "mirostat_tau",
    "mirostat_eta": "mirostat_eta",
    "seed": "seed",
    "stop": "stop",
    "num_keep": "n_keep",
}
# Fixed when the child starts: a request cannot change them (see the README).
LOAD_OPTIONS = frozenset(
    {
        "num_ctx",
        "num_batch",
        "num_gpu",
        "main_gpu",
        "low_vram",
        "f16_kv",
        "logits_all",
        "vocab_only",
        "use_mmap",
        "use_mlock",
        "embedding_only",
        "num_thread",
        "numa",
        "rope_frequency_base",
        "rope_frequency_scale",
    }
)


class BadRequest(ValueError):
    """A body Ollama would refuse (400)."""


@attrs.frozen
class ChildRequest:
    """What goes to the child: its route, the JSON body, and how to read the answer."""

    target: str
    body: Json
    kind: str  # "chat" (OpenAI chat chunks) or "completion" (llama.cpp's /completion)
    ignored: tuple[tuple[str, Any], ...] = ()  # load-time options given: (name, value)


def _options(req: Mapping[str, Any]) -> Mapping[str, Any]:
    options = req.get("options")
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise BadRequest("options must be an object")
    return options


def sampling(req: Mapping[str, Any], max_key: str) -> tuple[Json, tuple[tuple[str, Any], ...]]:
    """The child's sampling parameters from ``options`` (``num_predict`` as ``max_key``),
    and the load-time options that were given and cannot apply."""
    options = _options(req)
    out: Json = {}
    for key, value in options.items():
        if value is None:
            continue
        if key in _SAMPLING:
            out[_SAMPLING[key]] = value
        elif key == "num_predict" and isinstance(value, int) and value >= 0:
            out[max_key] = value  # -1 (no limit) and -2 (fill the context): the default
    ignored = tuple(
        sorted((k, v) for k, v in options.items() if k in LOAD_OPTIONS and v is not None)
    )
    return out, ignored


def _format(req: Mapping[str, Any]) -> Json | None:
    """``format``: "json" or a JSON schema, as the child's ``response_format``."""
    fmt = req.get("format")
    if fmt in (None, ""):
        return None
    if fmt == "json":
        return {"type": "json_object"}
    if isinstance(fmt, Mapping):
        return {"type": "json_schema", "json_schema": {"name": "format", "schema": dict(fmt)}}
    raise BadRequest(f'invalid format {json.dumps(fmt)}: want "json" or a JSON schema')


def _think(req: Mapping[str, Any], body: Json) -> None:
    """``think``: separate reasoning (the child's ``reasoning_content``, Ollama's
    ``thinking``) or ask the template not to think."""
    think = req.get("think")
    if think is None:
        return
    if think is False:
        body["chat_template_kwargs"] = {"enable_thinking": False}
        body["reasoning_format"] = "none"
    else:  # true, or a level ("low", "medium", "high") for models that take one
        body["reasoning_format"] = "deepseek"
        if isinstance(think, str):
            body["chat_template_kwargs"] = {"reasoning_effort": think}


def _image_url(data: object) -> Json:
    if not isinstance(data, str):
        raise BadRequest("images must be base64 strings")
    try:
        head = base64.b64decode(data[:64] + "=" * (-len(data[:64]) % 4), validate=False)
    except (binascii.Error, ValueError) as exc:
        raise BadRequest(f"invalid image: {exc}") from None
    mime = "image/jpeg"
    if head.startswith(b"\x89PNG"):
        mime = "image/png"
    elif head.startswith(b"GIF8"):
        mime = "image/gif"
    elif head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        mime = "image/webp"
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{data}"}}


def _content(text: str, images: object) -> str | list[Json]:
    if not images:
        return text
    if not isinstance(images, Sequence) or isinstance(images, str):
        raise BadRequest("images must be a list of base64 strings")
    parts: list[Json] = [_image_url(image) for image in images]
    if text:
        parts.append({"type": "text", "text": text})
    return parts


def _messages(raw: object) -> list[Json]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise BadRequest("messages must be a list")
    out: list[Json] = []
    call_ids: list[str] = []  # the last assistant message's calls, for the tool answers
    answered = 0
    for i, msg in enumerate(raw):
        if not isinstance(msg, Mapping) or not isinstance(msg.get("role"), str):
            raise BadRequest(f"messages[{i}] must be an object with a role")
        role = msg["role"]
        text = msg.get("content") or ""
        if not isinstance(text, str):
            raise BadRequest(f"messages[{i}].content must be a string")
        item: Json = {"role": role, "content": _content(text, msg.get("images"))}
        if isinstance(msg.get("thinking"), str) and msg["thinking"]:
            item["reasoning_content"] = msg["thinking"]
        calls = msg.get("tool_calls")
        if calls:
            item["tool_calls"], call_ids, answered = _calls(calls, i), [], 0
            call_ids = [c["id"] for c in item["tool_calls"]]
        if role == "tool":
            if answered < len(call_ids):
                item["tool_call_id"] = call_ids[answered]
                answered += 1
            if isinstance(msg.get("tool_name"), str):
                item["name"] = msg["tool_name"]
        out.append(item)
    return out


def _calls(calls: object, i: int) -> list[Json]:
    if not isinstance(calls, list):
        raise BadRequest(f"messages[{i}].tool_calls must be a list")
    out = []
    for n, call in enumerate(calls):
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise BadRequest(f"messages[{i}].tool_calls[{n}] needs function.name")
        args = function.get("arguments") or {}
        text = args if isinstance(args, str) else json.dumps(args)
        call_id = call.get("id") if isinstance(call.get("id"), str) else f"call_{i}_{n}"
        function = {"name": function["name"], "arguments": text}
        out.append({"id": call_id, "type": "function", "function": function})
    return out


def _chat(model: str, messages: list[Json], req: Mapping[str, Any], stream: bool) -> ChildRequest:
    body: Json = {"model": model, "messages": messages, "stream": stream}
    params, ignored = sampling(req, "max_tokens")
    body.update(params)
    if (fmt := _format(req)) is not None:
        body["response_format"] = fmt
    tools = req.get("tools")
    if tools:
        if not isinstance(tools, list):
            raise BadRequest("tools must be a list")
        body["tools"] = tools
    _think(req, body)
    if stream:
        body["stream_options"] = {"include_usage": True}
    return ChildRequest("/v1/chat/completions", body, "chat", ignored)


def chat_request(model: str, req: Mapping[str, Any], stream: bool) -> ChildRequest:
    return _chat(model, _messages(req.get("messages")), req, stream)


def _text(req: Mapping[str, Any], key: str) -> str:
    value = req.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadRequest(f"{key} must be a string")
    return value


def generate_request(model: str, req: Mapping[str, Any], stream: bool) -> ChildRequest:
    """``/api/generate``: templated (system + prompt as chat messages), raw (the prompt
    as is, ``/completion``) or fill-in-the-middle (``suffix``: ``/infill``)."""
    prompt, suffix, system = _text(req, "prompt"), _text(req, "suffix"), _text(req, "system")
    images = req.get("images")
    if suffix or req.get("raw"):
        params, ignored = sampling(req, "n_predict")
        body: Json = {"stream": stream, "cache_prompt": True, **params}
        if (fmt := _format(req)) is not None:
            schema = fmt.get("json_schema", {}).get("schema", {})
            body["json_schema"] = schema
        if images:
            raise BadRequest("images need a templated prompt (raw and suffix take none)")
        if suffix:
            body.update(input_prefix=prompt, input_suffix=suffix, prompt="")
            return ChildRequest("/infill", body, "completion", ignored)
        body["prompt"] = prompt
        return ChildRequest("/completion", body, "completion", ignored)
    messages: list[Json] = []
    if system:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": _content(prompt, images)})
    return _chat(model, messages, req, stream)


def embed_request(model: str, req: Mapping[str, Any], key: str) -> tuple[Json, int]:
    """``/api/embed`` (``input``: a string or a list) or ``/api/embeddings``
    (``prompt``): the child's ``/v1/embeddings`` body and how many inputs it holds."""
    value = req.get(key)
    inputs = [value] if isinstance(value, str) else value
    if value is None:
        inputs = []
    if not isinstance(inputs, list) or not all(isinstance(v, str) for v in inputs):
        raise BadRequest(f"{key} must be a string or a list of strings")
    body: Json = {"model": model, "input": inputs, "encoding_format": "float"}
    return body, len(inputs)
