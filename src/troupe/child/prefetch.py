"""Reading a model's files into the page cache before its child starts.

A model that waits for its slot (a victim draining its requests, or exiting) has
nothing to do meanwhile; the kernel can read its weights then, so the child's load
(llama.cpp maps the file) finds them in memory instead of on the disk. It is a hint
(``posix_fadvise(WILLNEED)``, asynchronous read-ahead, one call per chunk the device
reads at once): any error is ignored, and files that would take more than half of the
memory available are left alone, since reading them would only push other pages out.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil

__all__ = ["model_files", "prefetch", "readahead_chunk"]

log = logging.getLogger(__name__)

_QUEUE_LIMITS = ("read_ahead_kb", "max_sectors_kb")
_SHARD = re.compile(r"^(?P<stem>.+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.gguf$")


def model_files(first: Path, mmproj: Path | None = None) -> list[Path]:
    """``first`` and, for a split model (``x-00001-of-00003.gguf``), its other shards;
    then the projector."""
    files = [first]
    found = _SHARD.match(first.name)
    if found and int(found["i"]) == 1:
        n = int(found["n"])
        files += [
            first.with_name(f"{found['stem']}-{i:05d}-of-{n:05d}.gguf") for i in range(2, n + 1)
        ]
    if mmproj is not None:
        files.append(mmproj)
    return files


def _available() -> int:
    return int(psutil.virtual_memory().available)


def readahead_chunk(st_dev: int) -> int:
    """The most one ``WILLNEED`` reads ahead on the device holding a file: the kernel
    caps each call at the larger of the device's read-ahead and its largest request
    (``force_page_cache_ra``), so a whole file takes one call per chunk. 128 KiB (the
    usual read-ahead) where the device cannot be read (tmpfs, overlay, NFS)."""
    dev = Path(f"/sys/dev/block/{os.major(st_dev)}:{os.minor(st_dev)}")
    try:
        dev = dev.resolve(strict=True)
        if (dev / "partition").exists():
            dev = dev.parent
        kib = max(int((dev / "queue" / name).read_text()) for name in _QUEUE_LIMITS)
    except (OSError, ValueError):
        kib = 0
    return max(kib, 128) << 10


def prefetch(paths: Iterable[Path], available: Callable[[], int] = _available) -> int:
    """Ask the kernel to read ``paths`` ahead; the bytes asked for (0: left alone).
    Blocking (the kernel queues the reads): call it from a worker thread."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return 0  # not on this platform
    sizes: list[tuple[Path, int]] = []
    for path in paths:
        with contextlib.suppress(OSError):
            sizes.append((path, path.stat().st_size))
    total = sum(size for _, size in sizes)
    if not total or total > available() // 2:
        return 0
    asked = 0
    for path, size in sizes:
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            continue
        try:
            chunk = readahead_chunk(os.fstat(fd).st_dev)
            for offset in range(0, size, chunk):
                advise(fd, offset, chunk, os.POSIX_FADV_WILLNEED)
            asked += size
        except OSError as exc:
            log.debug("read-ahead of %s failed: %s", path, exc)
        finally:
            os.close(fd)
    return asked
