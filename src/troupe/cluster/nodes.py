"""The node list: ``--cluster-nodes`` is comma-separated URLs, or a file of them.

A file has one URL a line (``#`` comments) and is read again whenever it changes, so a
fourth node joins every node's list by one line in one shared file (the balancer's
configuration is rendered again from the same list: `troupe cluster render`).
"""

from __future__ import annotations

import os
from pathlib import Path

from troupe.cluster.placement import normalise_url
from troupe.errors import UsageError

__all__ = ["NodeList", "parse_urls"]


def parse_urls(text: str, separator: str | None = ",") -> tuple[str, ...]:
    """Normalised URLs, in order, each once."""
    parts = text.split(separator) if separator else text.splitlines()
    out: list[str] = []
    for part in parts:
        line = part.split("#", 1)[0].strip()
        if not line:
            continue
        url = normalise_url(line)
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"invalid node URL '{line}' (expected http(s)://HOST:PORT)")
        if url not in out:
            out.append(url)
    return tuple(out)


class NodeList:
    """Every node of the cluster, this one included."""

    def __init__(self, value: str) -> None:
        self._file: Path | None = None
        self._stamp: tuple[int, int] | None = None
        self._urls: tuple[str, ...] = ()
        path = Path(value).expanduser()
        if "://" not in value and path.is_file():
            self._file = path
            self.urls()
        else:
            self._urls = parse_urls(value)
            if not self._urls:
                raise UsageError("--cluster-nodes names no node")

    def urls(self) -> tuple[str, ...]:
        """The list now (a file is read again when its size or mtime changed)."""
        if self._file is None:
            return self._urls
        try:
            stat = os.stat(self._file)
            stamp = (stat.st_mtime_ns, stat.st_size)
            if stamp != self._stamp:
                self._urls = parse_urls(self._file.read_text(encoding="utf-8"), None)
                self._stamp = stamp
        except (OSError, UsageError):
            pass  # keep the last good list; a half-written file is read again next time
        return self._urls
