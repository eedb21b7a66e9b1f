"""What ``/api/tags``, ``/api/show`` and ``/api/ps`` say about a model, from the
catalog entry, its GGUF header (read once per file version) and the scheduler's view.

Ollama's ``digest`` is its manifest's sha256; troupe has no manifest, so the digest is
the sha256 of the model file's identity (path, size, modification time): stable while
the file is, changed when it is.
"""

from __future__ import annotations

import hashlib
import math
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import trio

from troupe.assembly import Troupe
from troupe.catalog import ModelEntry
from troupe.gguf import GGUFError, ModelFacts, read_header
from troupe.ollama.names import listed_name
from troupe.sched import ModelView

__all__ = ["capabilities", "chat_template", "ps_item", "show_json", "tags_item"]

Json = dict[str, Any]
_FOREVER = "2318-01-01T00:00:00Z"  # Ollama's answer for a model kept loaded (keep_alive -1)
_TRUE = ("", "1", "true", "on", "yes", "enabled")


def _rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def _facts(ctx: Troupe, entry: ModelEntry) -> ModelFacts | None:
    found = ctx.facts.facts(entry.model_path)
    return found if isinstance(found, ModelFacts) else None


def _file(entry: ModelEntry) -> tuple[int, float]:
    """Size (every shard) and modification time of the model's file."""
    path = entry.model_path
    if path is None:
        return 0, 0.0
    try:
        st = path.stat()
    except OSError:
        return 0, 0.0
    size = st.st_size
    if "-00001-of-" in path.name:
        prefix = path.name.split("-00001-of-")[0]
        size = sum(p.stat().st_size for p in path.parent.glob(f"{prefix}-0*-of-*.gguf"))
    return size, st.st_mtime


def _digest(entry: ModelEntry, size: int, mtime: float) -> str:
    ident = f"{entry.model_path}\0{size}\0{mtime}".encode()
    return hashlib.sha256(ident).hexdigest()


def _parameter_size(facts: ModelFacts | None) -> str:
    if facts is None or not facts.parameter_count:
        return (facts.size_label or "") if facts is not None else ""
    n = facts.parameter_count
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}".replace(".0" + unit, unit)
    return str(n)


def _details(facts: ModelFacts | None) -> Json:
    family = facts.architecture if facts is not None else ""
    return {
        "parent_model": "",
        "format": "gguf",
        "family": family,
        "families": [family] if family else None,
        "parameter_size": _parameter_size(facts),
        "quantization_level": (facts.file_type_name or "") if facts is not None else "",
    }


def tags_item(ctx: Troupe, entry: ModelEntry) -> Json:
    size, mtime = _file(entry)
    name = listed_name(entry)
    return {
        "name": name,
        "model": name,
        "modified_at": _rfc3339(mtime),
        "size": size,
        "digest": _digest(entry, size, mtime),
        "details": _details(_facts(ctx, entry)),
    }


def _flag(entry: ModelEntry, *spellings: str) -> bool:
    for spelling in spellings:
        value = entry.preset.get_spelling(spelling)
        if value is not None:
            return value.strip().lower() in _TRUE
    return False


def chat_template(ctx: Troupe, entry: ModelEntry) -> str | None:
    """The chat template the child uses: its preset's ``chat-template-file``, else the
    GGUF's own (a header read: call it in a thread)."""
    path = entry.preset.get_spelling("--chat-template-file")
    try:
        if path:
            return (ctx.catalog.cwd / Path(path)).read_text(errors="replace")
        if entry.model_path is not None:
            header = read_header(entry.model_path, check_data=False)
            return header.get_str("tokenizer.chat_template")
    except (OSError, GGUFError):
        pass
    return None


def capabilities(
    ctx: Troupe, entry: ModelEntry, view: ModelView | None, template: str | None
) -> list[str]:
    """Ollama's capabilities: completion or embedding, tools (the chat template handles
    them), vision (a projector), thinking (the template reasons)."""
    facts = _facts(ctx, entry)
    embedding = _flag(entry, "--embeddings", "--embedding") or bool(facts and facts.is_embedding)
    caps = ["embedding"] if embedding else ["completion"]
    if template is not None:
        tools = "tools" in template
    else:
        tools = bool(facts and facts.chat_template_mentions_tools)
    if tools and not embedding:
        caps.append("tools")
    info = view.loaded_info if view is not None else None
    arch = info.get("architecture") if isinstance(info, dict) else None
    inputs = arch.get("input_modalities") if isinstance(arch, dict) else None
    if not isinstance(inputs, list):
        inputs = list(entry.architecture.input_modalities)
    if "image" in inputs:
        caps.append("vision")
    if template is not None and ("enable_thinking" in template or "reasoning_content" in template):
        caps.append("thinking")
    return caps


def _model_info(facts: ModelFacts | None) -> Json:
    if facts is None:
        return {}
    arch = facts.architecture
    info: Json = {"general.architecture": arch}
    if facts.name:
        info["general.basename"] = facts.name
    if facts.file_type is not None:
        info["general.file_type"] = facts.file_type
    if facts.parameter_count is not None:
        info["general.parameter_count"] = facts.parameter_count
    for key, value in (
        ("context_length", facts.context_length),
        ("embedding_length", facts.embedding_length),
        ("block_count", facts.block_count),
        ("feed_forward_length", facts.feed_forward_length),
        ("vocab_size", facts.vocab_size),
    ):
        if value is not None:
            info[f"{arch}.{key}"] = value
    return info


def show_json(ctx: Troupe, entry: ModelEntry, template: str | None) -> Json:
    view = ctx.scheduler.snapshot.models.get(entry.name)
    facts = _facts(ctx, entry)
    _, mtime = _file(entry)
    path = entry.model_path or ""
    modelfile = (
        f"# troupe serves {entry.name} (Ollama API); its preset:\n"
        f"# {ctx.catalog.status_preset(entry).strip().replace(chr(10), chr(10) + '# ')}\n"
        f"FROM {path}\n"
    )
    return {
        "modelfile": modelfile,
        "parameters": "",
        "template": template or "",
        "details": _details(facts),
        "model_info": _model_info(facts),
        "capabilities": capabilities(ctx, entry, view, template),
        "modified_at": _rfc3339(mtime),
    }


def _expires_at(view: ModelView) -> str:
    """When the model unloads if no request comes: its TTL from the end of its last
    request; never (Ollama's far date) when pinned or without a TTL (troupe then
    unloads only to make room)."""
    if view.pin or view.ttl is None or math.isinf(view.ttl):
        return _FOREVER
    if view.in_flight:
        return _rfc3339(time.time() + view.ttl)
    left = view.idle_since + view.ttl - trio.current_time()
    return _rfc3339(time.time() + max(0.0, left))


def ps_item(ctx: Troupe, entry: ModelEntry, view: ModelView) -> Json:
    size, mtime = _file(entry)
    memory = view.memory_reserved or view.memory_used or view.memory_need
    held = sum(memory.values()) if memory else size
    gpu = sum(v for k, v in memory.items() if k != "host") if memory else 0
    facts = _facts(ctx, entry)
    ctx_size = entry.preset.get_spelling("--ctx-size") or ""
    n_ctx = int(ctx_size) if ctx_size.isdigit() and int(ctx_size) > 0 else None
    name = listed_name(entry)
    return {
        "name": name,
        "model": name,
        "size": held,
        "digest": _digest(entry, size, mtime),
        "details": _details(facts),
        "expires_at": _expires_at(view),
        "size_vram": gpu,
        "context_length": n_ctx or (facts.context_length if facts else None),
    }
