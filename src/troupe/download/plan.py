"""Which files ``org/repo[:TAG]`` means, from the hub's listing (no I/O here).

As llama.cpp's ``common_download_get_hf_plan`` (``common/download.cpp``): a repository
with ``preset.ini`` at its root is a remote preset (only that file); otherwise the model
file whose name carries the tag (default ``Q4_K_M``, then ``Q8_0``, then the first model
file when no tag was asked for), first shard preferred, with every shard of the same
split, plus the closest ``mmproj`` sidecar when the repository has one (the server
downloads it: ``download_mmproj`` is on for llama-server).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import attrs

from troupe.catalog.hfcache import find_best_mmproj, find_best_model, split_info

__all__ = ["DownloadPlan", "PlanError", "PlannedFile", "RemoteFile", "make_plan"]

_HEX40 = re.compile(r"[0-9a-f]{40}\Z")
_HEX64 = re.compile(r"[0-9a-f]{64}\Z")


class PlanError(Exception):
    """The repository has nothing that matches the request (the message says what it has)."""


@attrs.frozen
class RemoteFile:
    """One file of the hub's tree listing."""

    path: str
    size: int
    git_oid: str  # the git blob id (sha1 of "blob <size>\\0" + content)
    sha256: str | None = None  # LFS files: the content's sha256, also its blob name

    @property
    def oid(self) -> str:
        """The blob's name in the cache: the LFS sha256, else the git id (as HF names them)."""
        return self.sha256 or self.git_oid


@attrs.frozen
class PlannedFile:
    path: str  # inside the repository
    size: int
    oid: str  # the blob name
    sha256: str | None  # verified when set
    git_oid: str  # verified when there is no sha256
    role: str  # "model", "mmproj" or "preset"

    @classmethod
    def of(cls, f: RemoteFile, role: str) -> PlannedFile:
        return cls(f.path, f.size, f.oid, f.sha256, f.git_oid, role)


@attrs.frozen
class DownloadPlan:
    name: str  # as asked: "org/repo" or "org/repo:TAG"
    repo: str
    tag: str  # as asked ("" for none)
    branch: str
    commit: str
    files: tuple[PlannedFile, ...]

    @property
    def is_preset(self) -> bool:
        return any(f.role == "preset" for f in self.files)

    @property
    def total(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def listed_name(self) -> str:
        """The name the catalog will list: ``org/repo:TAG`` from the model file's name."""
        model = next((f for f in self.files if f.role == "model"), None)
        tag = split_info(model.path).tag if model is not None else ""
        return f"{self.repo}:{tag}" if tag else self.repo


def parse_listing(items: object) -> list[RemoteFile]:
    """The files of a ``tree?recursive=true`` answer; entries that are not sane files (bad
    oid, a path that climbs out of the snapshot) are dropped, as llama.cpp drops them."""
    out: list[RemoteFile] = []
    if not isinstance(items, list):
        return out
    for item in items:
        if not isinstance(item, dict) or item.get("type") != "file":
            continue
        path, size, oid = item.get("path"), item.get("size"), item.get("oid")
        if not isinstance(path, str) or not _safe_path(path):
            continue
        if not isinstance(oid, str) or not _HEX40.match(oid):
            continue
        sha = None
        lfs = item.get("lfs")
        if isinstance(lfs, dict):
            sha, size = lfs.get("oid"), lfs.get("size", size)
            if not isinstance(sha, str) or not _HEX64.match(sha):
                continue
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            continue
        out.append(RemoteFile(path, size, oid, sha))
    return out


def _safe_path(path: str) -> bool:
    parts = path.split("/")
    return bool(path) and not path.startswith("/") and all(p not in ("", ".", "..") for p in parts)


def _split_files(files: Sequence[RemoteFile], primary: RemoteFile) -> list[RemoteFile]:
    s = split_info(primary.path)
    if s.count <= 1:
        return [primary]
    shards = [
        f for f in files if (i := split_info(f.path)).count == s.count and i.prefix == s.prefix
    ]
    return sorted(shards, key=lambda f: split_info(f.path).index)


def _available(files: Sequence[RemoteFile]) -> str:
    ggufs = [f.path for f in files if f.path.endswith(".gguf")]
    return ", ".join(ggufs) if ggufs else "none"


def make_plan(
    name: str,
    repo: str,
    tag: str,
    branch: str,
    commit: str,
    files: Sequence[RemoteFile],
    *,
    mmproj: bool = True,
) -> DownloadPlan:
    """The files to fetch for ``name``; `PlanError` when the repository has none that fit."""
    preset = next((f for f in files if f.path == "preset.ini"), None)
    if preset is not None:
        return DownloadPlan(name, repo, tag, branch, commit, (PlannedFile.of(preset, "preset"),))
    primary = find_best_model(files, tag)
    if primary is None:
        what = f"no GGUF file with tag '{tag}'" if tag else "no GGUF model file"
        raise PlanError(f"{what} in repository {repo} (available GGUF files: {_available(files)})")
    planned = [PlannedFile.of(f, "model") for f in _split_files(files, primary)]
    s = split_info(primary.path)
    if s.count > len(planned):
        raise PlanError(f"{primary.path}: only {len(planned)} of its {s.count} shards are listed")
    if mmproj and (sib := find_best_mmproj(files, primary.path)) is not None:
        planned.append(PlannedFile.of(sib, "mmproj"))
    return DownloadPlan(name, repo, tag, branch, commit, tuple(planned))
