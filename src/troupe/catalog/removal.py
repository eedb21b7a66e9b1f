"""Removing a cache model's files (``DELETE /models``), as ``common_download_remove``.

``org/repo:TAG``: the snapshot entries of that tag, then the blobs no entry still
points to. A bare ``org/repo``: the repository's whole cache folder.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from troupe.catalog.hfcache import cached_files, is_valid_repo_id, split_info, split_repo_tag

__all__ = ["remove_cached"]


def _blob_of(entry: Path) -> Path | None:
    if not entry.is_symlink():
        return None
    return Path(os.path.normpath(entry.parent / os.readlink(entry)))


def remove_cached(cache: Path, name: str) -> bool:
    """Remove ``name``'s files from the HF cache; False when nothing was removed.
    ConfigError for a name that is not ``org/repo[:tag]``."""
    repo, tag = split_repo_tag(name)
    if not tag:
        if not is_valid_repo_id(repo):
            return False
        folder = cache / ("models--" + repo.replace("/", "--"))
        if not folder.exists():
            return False
        shutil.rmtree(folder, ignore_errors=True)
        return not folder.exists()
    files = cached_files(cache, repo)
    doomed = [f.local_path for f in files if split_info(f.path).tag == tag.upper()]
    if not doomed:
        return False
    blobs = [b for b in (_blob_of(p) for p in doomed) if b is not None]
    for path in doomed:
        with contextlib.suppress(OSError):
            path.unlink()
    kept = {_blob_of(f.local_path) for f in cached_files(cache, repo)}
    for blob in blobs:
        if blob not in kept:
            with contextlib.suppress(OSError):
                blob.unlink()
    return True
