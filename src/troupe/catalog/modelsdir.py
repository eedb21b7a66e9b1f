"""The ``--models-dir`` scan (``common_preset_context::load_from_models_dir``).

Top-level ``*.gguf`` files are one model each (named after the file with every
``.gguf`` removed; companions skipped; split shards not grouped). Each
sub-directory is one model named after it: its ``mmproj`` file (last seen), its
draft file (``mtp-``/``dspark-``/``dflash-``, first seen), its first shard
(``-00001-of-``) or else its model file (last seen). Deeper levels are ignored;
symlinks are followed. Listings are sorted by name (upstream: readdir order).

Paths in the result are spelled as upstream spells them, the ``--models-dir``
value joined with the file name (so a relative directory gives relative paths,
which a child resolves against the router's working directory); the directory
itself is read at its absolute path.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs

from troupe.errors import ConfigError

__all__ = ["LocalModel", "is_draft_file", "is_mmproj_file", "scan_models_dir"]

DRAFT_PREFIXES = ("mtp-", "dspark-", "dflash-")


@attrs.frozen
class LocalModel:
    name: str
    path: str
    mmproj: str = ""
    draft: str = ""


def is_mmproj_file(fname: str) -> bool:
    return "mmproj" in fname


def is_draft_file(fname: str) -> bool:
    return fname.startswith(DRAFT_PREFIXES)


def _listing(path: Path) -> list[os.DirEntry[str]]:
    with os.scandir(path) as it:
        return sorted(it, key=lambda e: os.fsencode(e.name))


def _is_dir(e: os.DirEntry[str]) -> bool:
    try:
        return e.is_dir()
    except OSError:
        return False


def _is_file(e: os.DirEntry[str]) -> bool:
    try:
        return e.is_file()
    except OSError:
        return False


def _scan_subdir(real: Path, shown: str, name: str) -> LocalModel | None:
    model = first_shard = mmproj = draft = ""
    try:
        entries = _listing(real)
    except OSError:
        return None
    for e in entries:
        if not _is_file(e) or not e.name.endswith(".gguf"):
            continue
        path = os.path.join(shown, e.name)
        if is_mmproj_file(e.name):
            mmproj = path
        elif is_draft_file(e.name):
            draft = draft or path  # first sidecar found wins
        elif "-00001-of-" in e.name:
            first_shard = path
        else:
            model = path
    chosen = first_shard or model
    return LocalModel(name, chosen, mmproj, draft) if chosen else None


def scan_models_dir(shown: str, real: Path) -> dict[str, LocalModel]:
    """Models found in directory ``real``, spelled ``shown``, by name (a later
    duplicate name replaces)."""
    if not real.is_dir():
        raise ConfigError(f"error: '{shown}' does not exist or is not a directory")
    found: dict[str, LocalModel] = {}
    try:
        entries = _listing(real)
    except OSError as exc:
        raise ConfigError(f"cannot read models directory '{shown}': {exc.strerror}") from None
    for e in entries:
        if _is_dir(e):
            sub = _scan_subdir(real / e.name, os.path.join(shown, e.name), e.name)
            if sub is not None:
                found[sub.name] = sub
            continue
        if not _is_file(e) or not e.name.endswith(".gguf"):
            continue
        if is_mmproj_file(e.name) or is_draft_file(e.name):
            continue  # a companion file cannot be loaded on its own
        name = e.name.replace(".gguf", "")
        found[name] = LocalModel(name, os.path.join(shown, e.name))
    return found
