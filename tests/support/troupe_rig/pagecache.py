"""How much of a file is in the page cache (``mincore``), and dropping it from there:
what the read-ahead tests observe, on the real kernel."""

from __future__ import annotations

import ctypes
import mmap
import os
import time
from pathlib import Path

__all__ = ["drop_pages", "resident_fraction", "wait_resident"]

_libc = ctypes.CDLL(None, use_errno=True)


def drop_pages(path: Path) -> None:
    """Write ``path`` out and ask the kernel to forget its pages (no root needed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def resident_fraction(path: Path) -> float:
    """The share of ``path``'s pages in memory now, 0.0 to 1.0."""
    size = path.stat().st_size
    if size == 0:
        return 1.0
    page = mmap.PAGESIZE
    pages = (size + page - 1) // page
    with path.open("rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as mm:
        anchor = ctypes.c_char.from_buffer(mm)  # a private mapping: untouched pages are the file's
        try:
            vec = (ctypes.c_ubyte * pages)()
            if _libc.mincore(ctypes.c_void_p(ctypes.addressof(anchor)), ctypes.c_size_t(size), vec):
                raise OSError(ctypes.get_errno(), "mincore failed")
            return sum(b & 1 for b in vec) / pages
        finally:
            del anchor


def wait_resident(path: Path, timeout: float = 10.0) -> float:
    """Until ``path`` is all in memory (or ``timeout``); the share then. Polls: the kernel
    reads ahead asynchronously and tells no one when it is done."""
    deadline = time.monotonic() + timeout
    while (share := resident_fraction(path)) < 1.0 and time.monotonic() < deadline:
        time.sleep(0.01)
    return share
