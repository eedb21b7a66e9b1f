"""Plain column tables for the listing commands (``troupe models``, ``troupe ps``)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["print_table"]


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Left-aligned columns two spaces apart, each as wide as its widest cell."""
    widths = [max(len(h), *(len(row[i]) for row in rows), 0) for i, h in enumerate(headers)]
    for line in (headers, *rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
