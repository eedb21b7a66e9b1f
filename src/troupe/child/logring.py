"""The last lines a child wrote on stderr, kept to explain a crash."""

from __future__ import annotations

from collections import deque

__all__ = ["LogRing"]


class LogRing:
    def __init__(self, size: int = 50) -> None:
        self._lines: deque[str] = deque(maxlen=size)

    def append(self, line: str) -> None:
        self._lines.append(line)

    def tail(self, n: int | None = None) -> list[str]:
        lines = list(self._lines)
        return lines if n is None else lines[-n:]

    def __len__(self) -> int:
        return len(self._lines)
