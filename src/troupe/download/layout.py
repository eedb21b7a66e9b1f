"""Where a download's bytes go in the HF hub cache (the layout troupe's catalog reads).

``models--org--repo/blobs/<oid>`` holds each verified file under its blob id (the LFS
sha256, else the git id: the names ``huggingface_hub`` and llama.cpp use, so either can
reuse what troupe fetched and the other way round). ``snapshots/<commit>/<path>`` is a
relative symlink to the blob, made only once the blob is verified; ``refs/<branch>``
holds the commit, without a newline (``huggingface_hub.scan_cache_dir`` reads the file
whole), written after the links so that no reader ever sees a ref without its snapshot.

In-progress bytes live in ``blobs/<oid>.downloadInProgress``, llama.cpp's name rather
than huggingface_hub's ``.incomplete``: llama.cpp resumes such a file with a ``Range``
request (as troupe does), so a ``llama-server -hf`` and troupe continue each other's
partial downloads, while huggingface_hub 2.x never resumes across processes (it writes
a uniquely named temporary file and deletes it on failure), so its name would buy
nothing. Neither tool lists a blob no snapshot points to.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from troupe.download.plan import DownloadPlan, PlannedFile

__all__ = ["PARTIAL_SUFFIX", "RepoLayout"]

PARTIAL_SUFFIX = ".downloadInProgress"


class RepoLayout:
    def __init__(self, cache: Path, repo: str) -> None:
        self.cache = cache
        self.repo = repo
        self.root = cache / ("models--" + repo.replace("/", "--"))

    def blob(self, f: PlannedFile) -> Path:
        return self.root / "blobs" / f.oid

    def partial(self, f: PlannedFile) -> Path:
        return self.root / "blobs" / (f.oid + PARTIAL_SUFFIX)

    def snapshot(self, commit: str, f: PlannedFile) -> Path:
        return self.root / "snapshots" / commit / f.path

    def have(self, f: PlannedFile) -> bool:
        """The blob is there at its size (a blob is only ever made from verified bytes)."""
        try:
            return self.blob(f).stat().st_size == f.size
        except OSError:
            return False

    def on_disk(self, f: PlannedFile) -> int:
        """Bytes of ``f`` already here (its blob, else its partial file): where a resumed
        download's progress starts, so its bar does not start at 0."""
        for path in (self.blob(f), self.partial(f)):
            try:
                return min(path.stat().st_size, f.size)
            except OSError:
                continue
        return 0

    def link(self, commit: str, f: PlannedFile) -> Path:
        """Point the snapshot entry at the blob (a relative symlink; a copy where the file
        system has no symlinks, as llama.cpp's degraded mode)."""
        entry = self.snapshot(commit, f)
        entry.parent.mkdir(parents=True, exist_ok=True)
        blob = self.blob(f)
        target = os.path.relpath(blob, entry.parent)
        if entry.is_symlink() and os.readlink(entry) == target:
            return entry
        tmp = entry.with_name(f".{entry.name}.{os.getpid()}.tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        try:
            tmp.symlink_to(target)
        except OSError:
            shutil.copyfile(blob, tmp)
        os.replace(tmp, entry)
        return entry

    def write_ref(self, branch: str, commit: str) -> None:
        ref = self.root / "refs" / branch
        ref.parent.mkdir(parents=True, exist_ok=True)
        tmp = ref.with_name(f".{ref.name}.{os.getpid()}.tmp")
        tmp.write_text(commit)
        os.replace(tmp, ref)

    def finish(self, plan: DownloadPlan) -> None:
        """Every blob of ``plan`` is verified: make its snapshot entries, then the ref."""
        for f in plan.files:
            self.link(plan.commit, f)
        self.write_ref(plan.branch, plan.commit)

    def discard(self, plan: DownloadPlan) -> None:
        """After a cancel: the plan's partial files, and its finished blobs that no
        snapshot entry points to (nobody would ever find them), are deleted."""
        linked = self._linked_blobs()
        for f in plan.files:
            with contextlib.suppress(FileNotFoundError):
                self.partial(f).unlink()
            if self.blob(f).name not in linked:
                with contextlib.suppress(FileNotFoundError):
                    self.blob(f).unlink()
        self._prune_empty()

    def _linked_blobs(self) -> set[str]:
        out: set[str] = set()
        for entry in (self.root / "snapshots").glob("*/**/*"):
            if entry.is_symlink():
                out.add(os.path.basename(os.readlink(entry)))
        return out

    def _prune_empty(self) -> None:
        """A cancelled first download leaves no empty ``models--`` folder behind."""
        for folder in (self.root / "blobs", self.root / "snapshots", self.root / "refs", self.root):
            with contextlib.suppress(OSError):
                folder.rmdir()  # only when empty
