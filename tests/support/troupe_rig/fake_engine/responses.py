"""JSON bodies shaped like the pinned llama-server's (key order included).

Only the fields a client or a router looks at carry meaning; the rest are
plausible constants so that shape checks against the real engine hold.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping

import attrs

from troupe_rig.fake_engine.config import FakeConfig

__all__ = [
    "BUILD_INFO",
    "VERSION",
    "Turn",
    "chat_chunk",
    "chat_final",
    "completion_chunk",
    "completion_final",
    "error_body",
    "model_info",
    "models_list",
    "oai_completion",
    "props",
    "slots",
    "timings",
]

VERSION = "0.0.0-fake"
BUILD_INFO = "b0-fake"  # llama-server reports "b<build>-<commit>"
_ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
FAKE_META = {"vocab_type": 1, "n_vocab": 294, "n_embd": 128, "n_params": 666_240, "ftype": "F16"}

_ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "server_error": 500,
    "not_supported_error": 501,
    "unavailable_error": 503,
    "exceed_context_size_error": 400,
}


def error_body(message: str, type_: str) -> tuple[int, dict[str, object]]:
    """``format_error_response``: status and ``{"error": {code, message, type}}``."""
    code = _ERROR_STATUS[type_]
    return code, {"error": {"code": code, "message": message, "type": type_}}


def model_info(cfg: FakeConfig, size: int, created: int) -> dict[str, object]:
    """The child's ``/v1/models`` item; also the payload of its ``ready`` state line."""
    return {
        "id": cfg.model_name,
        "aliases": list(cfg.aliases) or ([cfg.model] if cfg.model else []),
        "tags": list(cfg.tags),
        "object": "model",
        "architecture": {
            "input_modalities": ["text", "audio"] if cfg.audio else ["text"],
            "output_modalities": ["text"],
        },
        "created": created,
        "owned_by": "llamacpp",
        "meta": {
            "vocab_type": FAKE_META["vocab_type"],
            "n_vocab": FAKE_META["n_vocab"],
            "n_ctx": cfg.n_ctx,
            "n_ctx_train": 4096,
            "n_embd": FAKE_META["n_embd"],
            "n_params": FAKE_META["n_params"],
            "size": size,
            "ftype": FAKE_META["ftype"],
        },
    }


def models_list(cfg: FakeConfig, info: dict[str, object]) -> dict[str, object]:
    return {
        "models": [
            {
                "name": cfg.model_name,
                "model": cfg.model_name,
                "modified_at": "",
                "size": "",
                "digest": "",
                "type": "model",
                "description": "",
                "tags": [""],
                "capabilities": ["completion"],
                "parameters": "",
                "details": {
                    "parent_model": "",
                    "format": "gguf",
                    "family": "",
                    "families": [""],
                    "parameter_size": "",
                    "quantization_level": "",
                },
            }
        ],
        "object": "list",
        "data": [info],
    }


def props(cfg: FakeConfig, sleeping: bool) -> dict[str, object]:
    return {
        "default_generation_settings": {"params": {"n_predict": cfg.n_predict}, "n_ctx": cfg.n_ctx},
        "total_slots": cfg.n_slots,
        "model_alias": cfg.model_name,
        "model_ftype": FAKE_META["ftype"],
        "model_path": cfg.model or "",
        "modalities": {"vision": False, "video": False, "audio": cfg.audio},
        "media_marker": "<__media_fake__>",
        "endpoint_slots": True,
        "endpoint_props": False,
        "endpoint_metrics": False,
        "ui": True,
        "ui_settings": {},
        "chat_template": "",
        "chat_template_caps": {},
        "bos_token": "<s>",
        "eos_token": "</s>",
        "build_info": BUILD_INFO,
        "is_sleeping": sleeping,
        "cors_proxy_enabled": False,
    }


def slots(cfg: FakeConfig, busy: set[int]) -> list[dict[str, object]]:
    return [
        {"id": i, "n_ctx": cfg.n_ctx, "speculative": False, "is_processing": i in busy}
        for i in range(cfg.n_slots)
    ]


@attrs.define
class Turn:
    """One generation request as it runs: what was asked, what has been produced."""

    kind: str  # "native" (/completion), "oai" (/v1/completions) or "chat"
    prompt: str
    n_prompt: int
    slot: int
    cmpl_id: str = attrs.field(factory=lambda: "chatcmpl-" + _random_id())
    started: float = attrs.field(factory=time.monotonic)
    texts: list[str] = attrs.field(factory=list)
    ids: list[int] = attrs.field(factory=list)

    @property
    def content(self) -> str:
        return "".join(self.texts)

    @property
    def n_gen(self) -> int:
        return len(self.ids)

    @property
    def secs(self) -> float:
        return time.monotonic() - self.started


def _random_id() -> str:
    return "".join(secrets.choice(_ALNUM) for _ in range(32))


def timings(turn: Turn) -> dict[str, float | int]:
    n_prompt, n_gen, secs = turn.n_prompt, turn.n_gen, turn.secs
    gen_ms = secs * 1000.0
    return {
        "cache_n": 0,
        "prompt_n": n_prompt,
        "prompt_ms": 0.1,
        "prompt_per_token_ms": 0.1 / max(1, n_prompt),
        "prompt_per_second": n_prompt / 0.0001,
        "predicted_n": n_gen,
        "predicted_ms": gen_ms,
        "predicted_per_token_ms": gen_ms / n_gen if n_gen else 0.0,
        "predicted_per_second": n_gen / secs if secs > 0 else 0.0,
    }


def completion_chunk(turn: Turn) -> dict[str, object]:
    """A streamed ``/completion`` token (``id_slot`` is -1 in these, as upstream)."""
    return {
        "index": 0,
        "content": turn.texts[-1],
        "tokens": [turn.ids[-1]],
        "stop": False,
        "id_slot": -1,
        "tokens_predicted": turn.n_gen,
        "tokens_evaluated": turn.n_prompt,
    }


def completion_final(cfg: FakeConfig, turn: Turn, stream: bool) -> dict[str, object]:
    return {
        "index": 0,
        "content": "" if stream else turn.content,
        "tokens": [],
        "id_slot": turn.slot,
        "stop": True,
        "model": cfg.model_name,
        "tokens_predicted": turn.n_gen,
        "tokens_evaluated": turn.n_prompt,
        "generation_settings": {"n_predict": turn.n_gen, "seed": 4294967295, "temperature": 0.8},
        "prompt": f"<s> {turn.prompt}",
        "has_new_line": "\n" in turn.content,
        "truncated": False,
        "stop_type": "limit",
        "stopping_word": "",
        "tokens_cached": turn.n_prompt + turn.n_gen,
        "timings": timings(turn),
    }


def _usage(turn: Turn) -> dict[str, object]:
    return {
        "completion_tokens": turn.n_gen,
        "prompt_tokens": turn.n_prompt,
        "total_tokens": turn.n_gen + turn.n_prompt,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def _envelope(cfg: FakeConfig, turn: Turn, obj: str) -> dict[str, object]:
    return {
        "created": int(time.time()),
        "id": turn.cmpl_id,
        "model": cfg.model_name,
        "system_fingerprint": BUILD_INFO,
        "object": obj,
    }


def oai_completion(cfg: FakeConfig, turn: Turn, *, chunk: bool, last: bool) -> dict[str, object]:
    """``/v1/completions``: a streamed token (``chunk``), the streamed end, or the whole answer."""
    text = turn.texts[-1] if chunk else "" if last else turn.content
    finish = None if chunk else "length"
    choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}
    body: dict[str, object] = {"choices": [choice], **_envelope(cfg, turn, "text_completion")}
    if not chunk:
        body["usage"] = _usage(turn)
        body["timings"] = timings(turn)
    return body


def chat_chunk(
    cfg: FakeConfig, turn: Turn, delta: Mapping[str, object], finish: str | None
) -> dict[str, object]:
    choice = {"finish_reason": finish, "index": 0, "delta": dict(delta)}
    return {"choices": [choice], **_envelope(cfg, turn, "chat.completion.chunk")}


def chat_final(cfg: FakeConfig, turn: Turn) -> dict[str, object]:
    message = {"role": "assistant", "content": turn.content}
    choice = {"finish_reason": "length", "index": 0, "message": message}
    body: dict[str, object] = {"choices": [choice], **_envelope(cfg, turn, "chat.completion")}
    body["usage"] = _usage(turn)
    body["timings"] = timings(turn)
    return body
