"""What a model can do, as troupe shows it in ``/models`` (upstream's ``architecture`` object).

* ``input_modalities``: ``text``, plus ``image``/``audio`` from the mmproj file's
  ``clip.has_vision_encoder``/``clip.has_audio_encoder``. Following Jan, an
  mmproj that sets neither flag counts as vision. (The pinned llama.cpp reads a
  missing flag as false; old projectors predate the flags and were all vision.)
* ``output_modalities``: ``decisions`` for the decision types of this llama.cpp
  fork (``{arch}.decision.type``), else ``text``.
* embedding models: Jan's rule (architecture list, ``embed`` in the name, or a
  positive ``{arch}.pooling_type``).
* a ``clip`` file is a projector, never a main model.
"""

from __future__ import annotations

import os

from troupe.gguf._source import GGUFError
from troupe.gguf.arch import EMBEDDING_ARCHS
from troupe.gguf.header import read_header
from troupe.gguf.records import GGUFHeader

__all__ = [
    "CLIP_REJECTION",
    "DECISION_TYPES",
    "input_modalities",
    "is_embedding_model",
    "main_model_rejection",
    "mmproj_modalities",
    "output_modalities",
    "read_mmproj_modalities",
]

# common_decision_type names (common/common.cpp) that make a model answer decisions.
DECISION_TYPES = frozenset({"openjev", "lev", "kev", "nimble", "laya", "clef"})

CLIP_REJECTION = (
    "this is a CLIP multimodal projector (general.architecture = clip), not a "
    "text model: use it as the --mmproj of a model"
)


def _flag(header: GGUFHeader, key: str) -> bool | None:
    """A boolean flag as Jan reads it: absent -> None; ``true`` (any case) -> True."""
    v = header.get(key)
    if v is None:
        return None
    if isinstance(v, bool):
        return v
    return isinstance(v, str) and v.lower() == "true"


def mmproj_modalities(header: GGUFHeader) -> tuple[str, ...]:
    """The input modalities an mmproj adds: a subset of ``("image", "audio")``.

    Raises `GGUFError` if the file is not a ``clip`` projector.
    """
    arch = header.get_str("general.architecture")
    if arch != "clip":
        raise GGUFError(f"{header.path}: not an mmproj file (architecture {arch!r}, not 'clip')")
    vision = _flag(header, "clip.has_vision_encoder")
    audio = _flag(header, "clip.has_audio_encoder")
    if vision is None and audio is None:
        return ("image",)
    return tuple(m for m, on in (("image", vision), ("audio", audio)) if on)


def read_mmproj_modalities(path: str | os.PathLike[str]) -> tuple[str, ...]:
    """`mmproj_modalities` of the file at `path`."""
    return mmproj_modalities(read_header(path, check_data=False))


def input_modalities(mmproj: GGUFHeader | None) -> tuple[str, ...]:
    """``/models`` ``architecture.input_modalities`` for a model with this mmproj."""
    return ("text",) if mmproj is None else ("text", *mmproj_modalities(mmproj))


def output_modalities(decision_type: str | None) -> tuple[str, ...]:
    """``/models`` ``architecture.output_modalities`` (server_model_output_modalities)."""
    return ("decisions",) if decision_type in DECISION_TYPES else ("text",)


def is_embedding_model(arch: str, pooling_type: int | None) -> bool:
    """Jan's ``detectEmbeddingFromGgufMeta``."""
    return arch in EMBEDDING_ARCHS or "embed" in arch.lower() or (pooling_type or 0) > 0


def main_model_rejection(arch: str) -> str | None:
    """Why a file with this architecture cannot be the main model, or None."""
    return CLIP_REJECTION if arch == "clip" else None
