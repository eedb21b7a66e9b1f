"""Test helpers that build HF hub caches and model folders on disk."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from troupe.catalog import Catalog

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER_COMMIT = "fedcba9876543210fedcba9876543210fedcba98"
HELP_SNAPSHOT = Path(__file__).parents[2] / "data" / "llama-server-help.txt"

# build(ini=..., cli=[...], models_dir=..., env=..., reload=..., models_max=..., probe=...)
BuildFn = Callable[..., Catalog]


def add_repo(
    cache: Path,
    repo: str,
    files: Sequence[str],
    *,
    refs: Mapping[str, str] | None = None,
    commit: str = COMMIT,
    symlink: bool = True,
) -> Path:
    """An HF hub repo folder: each file a blob symlinked from the snapshot (or a plain
    file); ``refs`` defaults to ``{"main": commit}``. Returns the snapshot folder."""
    root = cache / ("models--" + repo.replace("/", "--"))
    snap = root / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    (root / "blobs").mkdir(exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    for name, value in (refs if refs is not None else {"main": commit}).items():
        (root / "refs" / name).write_text(value)
    for i, rel in enumerate(files):
        target = snap / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if symlink:
            blob = root / "blobs" / f"{i:040x}"
            blob.write_bytes(b"GGUF")
            target.symlink_to(Path("../" * (rel.count("/") + 2) + "blobs") / blob.name)
        else:
            target.write_bytes(b"GGUF")
    return snap


def touch(root: Path, *names: str) -> None:
    for name in names:
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"GGUF")
