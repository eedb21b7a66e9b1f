"""A Hugging Face cache on disk, as huggingface_hub lays it out, for tests of cache models."""

from __future__ import annotations

import os
from pathlib import Path

from troupe_rig.tiny_gguf import TinyModel, write_tiny_gguf

__all__ = ["COMMIT", "write_hf_cache"]

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def write_hf_cache(
    root: Path, repo_id: str = "org/repo", tags: tuple[str, ...] = ("Q4_K_M", "Q8_0")
) -> Path:
    """``models--org--repo`` with one tiny GGUF per tag, snapshot entries linking blobs."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for i, tag in enumerate(tags):
        blob = repo / "blobs" / f"oid{i}"
        write_tiny_gguf(blob, TinyModel(name=tag, seed=i))
        os.symlink(f"../../blobs/oid{i}", snapshot / f"model-{tag}.gguf")
    return repo
