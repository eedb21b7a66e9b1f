"""A bounded, buffered byte source for the GGUF header reader.

Reads the file in chunks with plain ``read`` calls (no ``mmap``: a file that
shrinks under an ``mmap`` raises SIGBUS and would kill the whole service).
Every read is checked against the file size and a byte limit before anything
is allocated, so a corrupt length gives a `GGUFError`, never a hang or a huge
allocation.
"""

from __future__ import annotations

import struct
from typing import BinaryIO

from troupe.errors import TroupeError

_CHUNK = 1 << 20


class GGUFError(TroupeError):
    """A GGUF file that cannot be read: not GGUF, truncated, corrupt or unsupported."""


class Source:
    """Sequential reader over ``[0, size)`` of a binary file, `limit` bytes at most."""

    __slots__ = ("_f", "base", "buf", "limit", "path", "pos", "size", "u32", "u64")

    def __init__(self, f: BinaryIO, size: int, limit: int, path: str) -> None:
        self._f = f
        self.size = size
        self.limit = min(size, limit)
        self.path = path
        self.buf = b""  # file bytes [base, base + len(buf))
        self.base = 0
        self.pos = 0  # index into buf
        self.set_order("<")

    def set_order(self, order: str) -> None:
        self.u32 = struct.Struct(order + "I").unpack_from
        self.u64 = struct.Struct(order + "Q").unpack_from

    def tell(self) -> int:
        return self.base + self.pos

    def remaining(self) -> int:
        return self.size - self.tell()

    def _bounds(self, end: int) -> None:
        if end > self.size:
            raise GGUFError(f"truncated: needs {end} bytes but the file has {self.size}")
        if end > self.limit:
            raise GGUFError(f"header is larger than the {self.limit}-byte limit")

    def ensure(self, n: int) -> None:
        """Make ``buf[pos:pos + n]`` available."""
        if self.pos + n <= len(self.buf):
            return
        start = self.tell()
        self._bounds(start + n)
        self._f.seek(start)
        data = self._f.read(max(n, min(_CHUNK, self.limit - start)))
        if len(data) < n:
            raise GGUFError(f"truncated: file ended at {start + len(data)} (it shrank?)")
        self.buf, self.base, self.pos = data, start, 0

    def skip(self, n: int) -> None:
        end = self.tell() + n
        self._bounds(end)
        if self.pos + n <= len(self.buf):
            self.pos += n
        else:
            self.buf, self.base, self.pos = b"", end, 0

    def read(self, n: int) -> bytes:
        self.ensure(n)
        start = self.pos
        self.pos += n
        return self.buf[start : self.pos]

    def read_u32(self) -> int:
        self.ensure(4)
        (v,) = self.u32(self.buf, self.pos)
        self.pos += 4
        return int(v)

    def read_u64(self) -> int:
        self.ensure(8)
        (v,) = self.u64(self.buf, self.pos)
        self.pos += 8
        return int(v)

    def read_str_bytes(self, cap: int) -> bytes:
        n = self.read_u64()
        if n > cap:
            raise GGUFError(f"string of {n} bytes exceeds the {cap}-byte cap")
        return self.read(n)

    def skip_strings(self, count: int) -> None:
        """Skip `count` length-prefixed strings without reading them (the hot loop).

        No per-string cap is needed: nothing is allocated, and a bad length
        lands past the file end, which `_bounds` reports.
        """
        u64 = self.u64
        buf, pos, last = self.buf, self.pos, len(self.buf) - 8
        for _ in range(count):
            if pos > last:  # the length prefix is not (all) in the buffer
                self.pos = pos
                self.ensure(8)
                buf, pos, last = self.buf, self.pos, len(self.buf) - 8
            (n,) = u64(buf, pos)
            pos += 8 + n
        self.pos = pos
        if pos > len(buf):  # the last string ends past the buffer
            self.skip(0)
