"""The dashboard's static files, served from the package (no build step).

The page and its scripts are public, like the engine's web UI: they hold no data.
Everything they show comes from the keyed API (``/models``, ``/models/sse``,
``/logs/stream``, ``/metrics``), read with ``fetch`` so the page can send the key
itself; a browser's ``EventSource`` cannot send an ``Authorization`` header.
The routes that serve them are `troupe.http.dashboard`'s.
"""

from __future__ import annotations

import importlib.resources

__all__ = ["CONTENT_TYPES", "load_static"]

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".txt": "text/plain; charset=utf-8",
}


def load_static() -> dict[str, bytes]:
    """Every file under ``troupe/ops/static`` by its relative path (read once)."""
    root = importlib.resources.files("troupe.ops") / "static"
    out: dict[str, bytes] = {}
    stack = [("", root)]
    while stack:
        base, folder = stack.pop()
        for item in folder.iterdir():
            name = f"{base}{item.name}"
            if item.is_dir():
                stack.append((name + "/", item))
            elif any(name.endswith(ext) for ext in CONTENT_TYPES):
                out[name] = item.read_bytes()
    return out
