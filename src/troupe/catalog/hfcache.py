"""The Hugging Face hub cache, read offline the way llama.cpp reads it.

Sources: ``common/hf-cache.cpp`` (cache directory, ``models--org--repo`` folders,
refs, snapshots, repo id validation) and ``common/download.cpp``
(``get_gguf_split_info``, ``common_list_cached_models``, ``find_best_model``,
``find_best_sibling``, ``common_download_resolve_path``).

Directory order is unspecified upstream; here every listing is sorted by name so
that "first found" is deterministic.
"""

from __future__ import annotations

import os
import pwd
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

import attrs

from troupe.errors import ConfigError

__all__ = [
    "CachedFile",
    "SplitInfo",
    "cache_dir",
    "cached_files",
    "cached_models",
    "canonical_tag",
    "find_best_mmproj",
    "find_best_model",
    "is_valid_repo_id",
    "resolve_path",
    "split_info",
    "split_repo_tag",
]

_FLAGS = re.IGNORECASE | re.ASCII
_RE_SPLIT = re.compile(r"(.+)-([0-9]{5})-of-([0-9]{5})", _FLAGS)
_RE_TAG = re.compile(r"[-.]([A-Z0-9_]+)\Z", _FLAGS)
_RE_COMMIT = re.compile(r"[0-9A-Fa-f]{40}\Z")
_RE_DIGITS = re.compile(r"[0-9]+")
_EXCLUDED = ("mmproj", "mtp-", "eagle3-", "dflash-", "dspark-")
_NOT_MODEL = ("mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-")


class _HasPath(Protocol):
    @property
    def path(self) -> str: ...  # path inside the repository, with "/" separators


_F = TypeVar("_F", bound=_HasPath)  # a cached file, or one listed by the hub


@attrs.frozen
class CachedFile:
    repo_id: str  # "org/repo"
    path: str  # path inside the snapshot, with "/" separators
    local_path: Path  # the snapshot entry (usually a symlink into blobs/)


@attrs.frozen
class SplitInfo:
    prefix: str  # file path without ".gguf" and without "-0000i-of-0000n"
    tag: str  # upper-case quantisation tag, "" if none
    index: int
    count: int


def cache_dir(environ: Mapping[str, str]) -> Path:
    """The hub directory: the first non-empty of the upstream candidates."""
    candidates: tuple[tuple[str, tuple[str, ...]], ...] = (
        ("LLAMA_CACHE", ()),
        ("HF_HUB_CACHE", ()),
        ("HUGGINGFACE_HUB_CACHE", ()),
        ("HF_HOME", ("hub",)),
        ("XDG_CACHE_HOME", ("huggingface", "hub")),
        ("HOME", (".cache", "huggingface", "hub")),
    )
    for var, tail in candidates:
        base = environ.get(var, "")
        if base:
            return Path(base).joinpath(*tail)
    try:
        home = pwd.getpwuid(os.getuid()).pw_dir
    except KeyError:
        home = ""
    if home:
        return Path(home) / ".cache" / "huggingface" / "hub"
    raise ConfigError("Failed to determine HF cache directory")


def canonical_tag(tag: str) -> str:
    """INI section tags: the last ``[-.]TAG`` of ``tag`` upper-cased, else all of it."""
    m = _RE_TAG.search(tag)
    return _ascii_upper(m.group(1) if m else tag)


def _ascii_upper(s: str) -> str:
    return s.translate(_UPPER)


_UPPER = str.maketrans("abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def is_valid_repo_id(repo_id: str) -> bool:
    """``[A-Za-z0-9_]`` plus ``/.-`` between them, exactly one ``/``, at most 256 chars."""
    if not repo_id or len(repo_id) > 256:
        return False
    slashes, special = 0, True
    for c in repo_id:
        if c.isascii() and (c.isalnum() or c == "_"):
            special = False
        elif c in "/.-":
            if special:
                return False
            slashes += c == "/"
            special = True
        else:
            return False
    return not special and slashes == 1


def split_info(path: str) -> SplitInfo:
    """``get_gguf_split_info``; a path not ending in ``.gguf`` gives index 0 and no tag."""
    if not path.endswith(".gguf"):
        return SplitInfo("", "", 0, 0)
    prefix = path[: -len(".gguf")]
    index = count = 1
    if m := _RE_SPLIT.fullmatch(prefix):
        prefix, index, count = m.group(1), int(m.group(2)), int(m.group(3))
    m = _RE_TAG.search(prefix)
    return SplitInfo(prefix, _ascii_upper(m.group(1)) if m else "", index, count)


def split_repo_tag(hf_repo: str) -> tuple[str, str]:
    """``common_download_split_repo_tag``: "org/repo:TAG" -> ("org/repo", "TAG")."""
    parts = hf_repo.split(":")
    repo = parts[0]
    if len(repo.split("/")) != 2:
        # upstream's message ends with a newline; ConfigError messages are one line
        raise ConfigError("error: invalid HF repo format, expected <user>/<model>[:quant]")
    return repo, parts[-1] if len(parts) > 1 else ""


def _first_line(path: Path) -> str:
    try:
        with path.open("rb") as f:
            return f.readline().split(b"\n", 1)[0].decode("utf-8", "replace")
    except OSError:
        return ""


def _cached_ref(repo_path: Path) -> str:
    refs = repo_path / "refs"
    if not refs.is_dir():
        return ""
    fallback = ""
    for entry in sorted(refs.iterdir()):
        if not entry.is_file():
            continue
        commit = _first_line(entry)
        if not _RE_COMMIT.match(commit):
            continue
        if entry.name == "main":
            return commit
        fallback = fallback or commit
    return fallback


def _walk(root: Path, rel: str, out: list[tuple[str, Path]]) -> None:
    # recursive_directory_iterator without follow_directory_symlink: symlinks are
    # taken as files (even to directories), real directories are entered.
    try:
        entries = sorted(os.scandir(root / rel if rel else root), key=lambda e: e.name)
    except OSError:
        return
    for e in entries:
        sub = f"{rel}/{e.name}" if rel else e.name
        if e.is_symlink():
            out.append((sub, Path(e.path)))
        elif e.is_dir(follow_symlinks=False):
            _walk(root, sub, out)
        elif e.is_file(follow_symlinks=False):
            out.append((sub, Path(e.path)))


def cached_files(cache: Path, repo_id: str = "") -> list[CachedFile]:
    """``hf_cache::get_cached_files``: the files of the resolved snapshot of each repo."""
    try:
        return _cached_files(cache, repo_id)
    except PermissionError as exc:
        where = exc.filename or cache
        raise ConfigError(
            f"cannot read the Hugging Face cache {where}: permission denied"
        ) from None


def _cached_files(cache: Path, repo_id: str) -> list[CachedFile]:
    if not cache.is_dir() or (repo_id and not is_valid_repo_id(repo_id)):
        return []
    files: list[CachedFile] = []
    # one repo id has exactly one folder, so a lookup need not list the cache
    folders = [cache / ("models--" + repo_id.replace("/", "--"))] if repo_id else cache.iterdir()
    for repo in sorted(folders):
        if not repo.is_dir() or not (repo / "snapshots").exists():
            continue
        if not repo.name.startswith("models--"):
            continue
        rid = repo.name[len("models--") :].replace("--", "/")
        if not is_valid_repo_id(rid) or (repo_id and rid != repo_id):
            continue
        commit = _cached_ref(repo)
        snapshot = repo / "snapshots" / commit
        if not commit or not snapshot.is_dir():
            continue
        found: list[tuple[str, Path]] = []
        _walk(snapshot, "", found)
        files.extend(CachedFile(rid, rel, local) for rel, local in found)
    return files


def cached_models(cache: Path) -> list[str]:
    """``common_list_cached_models``: "org/repo:TAG" names, first file of each wins."""
    seen: dict[str, None] = {}
    for f in cached_files(cache):
        s = split_info(f.path)
        if s.index != 1 or not s.tag or any(x in s.prefix for x in _EXCLUDED):
            continue
        seen.setdefault(f"{f.repo_id}:{s.tag}", None)
    return list(seen)


def _is_model_file(path: str) -> bool:
    if not path.endswith(".gguf"):
        return False
    name = path.rsplit("/", 1)[-1]
    return not any(x in name for x in _NOT_MODEL)


def find_best_model(files: Sequence[_F], tag: str) -> _F | None:
    """The file ``-hf repo:tag`` would load: the tag (default Q4_K_M, Q8_0), else the first."""
    for t in [tag] if tag else ["Q4_K_M", "Q8_0"]:
        try:
            pattern = re.compile(t + "[.-]", _FLAGS)
        except re.error:
            continue  # upstream's std::regex would throw here; no such tag exists
        for f in files:
            if _is_model_file(f.path) and pattern.search(f.path):
                s = split_info(f.path)
                if s.count > 1 and s.index != 1:
                    continue
                return f
    if not tag:
        for f in files:
            if _is_model_file(f.path):
                s = split_info(f.path)
                if not (s.count > 1 and s.index != 1):
                    return f
    return None


def _quant_bits(tag: str) -> int:
    m = _RE_DIGITS.search(tag)
    return int(m.group()) if m else 0


def find_best_mmproj(files: Sequence[_F], model: str) -> _F | None:
    """``find_best_sibling(files, model, "mmproj")``: deepest shared directory, then
    the closest quantisation to the model's."""
    model_bits = _quant_bits(split_info(model).tag)
    model_dirs = model.split("/")[:-1]
    best: _F | None = None
    best_depth = best_diff = 0
    for f in files:
        if not f.path.endswith(".gguf") or "mmproj" not in f.path:
            continue
        sib_dirs = f.path.split("/")[:-1]
        depth = 0
        while depth < min(len(model_dirs), len(sib_dirs)) and model_dirs[depth] == sib_dirs[depth]:
            depth += 1
        if depth != len(sib_dirs):
            continue  # the sibling must sit in the model's directory or above it
        diff = abs(_quant_bits(split_info(f.path).tag) - model_bits)
        if best is None or depth > best_depth or (depth == best_depth and diff < best_diff):
            best, best_depth, best_diff = f, depth, diff
    return best


def resolve_path(cache: Path, hf_repo: str, hf_file: str = "") -> Path | None:
    """``common_download_resolve_path``: the cached file for ``repo[:tag]``, offline.

    Raises ConfigError for a repo that is not ``<user>/<model>``, as upstream throws.
    """
    repo, tag = split_repo_tag(hf_repo)
    files = cached_files(cache, repo)
    if not files:
        return None
    if hf_file:
        return next((f.local_path for f in files if f.path == hf_file), None)
    best = find_best_model(files, tag)
    return None if best is None else best.local_path
