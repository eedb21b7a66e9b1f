"""GGUF facts for catalog entries: the ``architecture`` probe and troupe's extra keys.

Headers are read once per file version (path, size, mtime) and kept, so a reload
of a large catalog reads only what changed.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import attrs

from troupe.catalog.entry import Architecture, ModelEntry
from troupe.gguf import GGUFError, ModelFacts, input_modalities, read_header, read_model_facts
from troupe.gguf.facts import shard_paths

__all__ = ["FactsCache", "facts_json", "file_bytes", "human_bytes"]

log = logging.getLogger(__name__)


@attrs.frozen
class _Key:
    path: str
    size: int
    mtime_ns: int


def _key(path: Path) -> _Key | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return _Key(str(path), st.st_size, st.st_mtime_ns)


class FactsCache:
    """Model facts and mmproj modalities by file version. Thread-safe: reloads scan in a
    worker thread while requests read."""

    def __init__(self, no_mmproj: bool = False) -> None:
        self.no_mmproj = no_mmproj  # --no-mmproj on the router hides projector modalities
        self._facts: dict[_Key, ModelFacts | str] = {}
        self._mmproj: dict[_Key, tuple[str, ...]] = {}
        self._lock = threading.Lock()

    def facts(self, path: Path | None) -> ModelFacts | str | None:
        """The file's facts, an error text when it cannot be read, None without a file."""
        if path is None:
            return None
        key = _key(path)
        if key is None:
            return f"cannot read {path}"
        with self._lock:
            found = self._facts.get(key)
        if found is not None:
            return found
        try:
            value: ModelFacts | str = read_model_facts(path)
        except (GGUFError, OSError) as exc:
            value = str(exc)
        with self._lock:
            self._facts[key] = value
        return value

    def mmproj_modalities(self, path: Path | None) -> tuple[str, ...]:
        if path is None or self.no_mmproj:
            return ("text",)
        key = _key(path)
        if key is None:
            return ("text",)
        with self._lock:
            found = self._mmproj.get(key)
        if found is not None:
            return found
        try:
            modalities = input_modalities(read_header(path, check_data=False))
        except (GGUFError, OSError) as exc:
            log.debug("cannot read mmproj %s: %s", path, exc)
            modalities = ("text",)
        with self._lock:
            self._mmproj[key] = modalities
        return modalities

    def architecture(self, entry: ModelEntry) -> Architecture:
        """The `ArchitectureProbe` for `build_catalog`: GGUF output, mmproj input."""
        facts = self.facts(entry.model_path)
        output = facts.output_modalities if isinstance(facts, ModelFacts) else ("text",)
        return Architecture(self.mmproj_modalities(entry.mmproj_path), tuple(output))


def facts_json(facts: ModelFacts | str | None) -> dict[str, Any] | None:
    """The GGUF part of troupe's extra key in ``GET /models``."""
    if facts is None:
        return None
    if isinstance(facts, str):
        return {"error": facts}
    return {
        "architecture": facts.architecture,
        "name": facts.name,
        "context_length": facts.context_length,
        "parameters": facts.parameter_count,
        "size_bytes": facts.tensor_bytes,
        "file_type": facts.file_type_name,
        "layers": facts.n_layer,
        "embedding": facts.is_embedding,
        "tools": facts.chat_template_mentions_tools,
        "chat_template": facts.has_chat_template,
        "mtp_layers": facts.mtp_layers,
        "rejected": facts.rejection,
    }


def file_bytes(path: Path | None, facts: ModelFacts | str | None) -> int | None:
    """The model's size on disk, every shard: the one size ``troupe models``, ``troupe
    doctor`` and ``GET /models`` (``gguf.file_bytes``) show."""
    if path is None or not isinstance(facts, ModelFacts):
        return None
    total = 0
    for shard in shard_paths(path, facts.split_count):
        try:
            total += Path(shard).stat().st_size
        except OSError:
            continue
    return total


def human_bytes(n: int | None) -> str:
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"
