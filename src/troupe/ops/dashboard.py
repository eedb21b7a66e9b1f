"""The dashboard's static files, served from the package (no build step).

The page and its scripts are public, like the engine's web UI: they hold no data.
Everything they show comes from the keyed API (``/models``, ``/models/sse``,
``/logs/stream``, ``/metrics``), read with ``fetch`` so the page can send the key
itself; a browser's ``EventSource`` cannot send an ``Authorization`` header.
"""

from __future__ import annotations

import hashlib
import importlib.resources

from quart import Response, redirect, request
from quart_trio import QuartTrio

from troupe.http.errors import JSON_TYPE, error_body
from troupe.http.routing import DASHBOARD
from troupe.router import Router

__all__ = ["load_static", "register_dashboard_routes"]

_TYPES = {
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
            elif any(name.endswith(ext) for ext in _TYPES):
                out[name] = item.read_bytes()
    return out


def register_dashboard_routes(app: QuartTrio, ctx: Router) -> None:
    prefix = ctx.settings.api_prefix
    files = load_static()
    etags = {name: hashlib.sha256(data).hexdigest()[:16] for name, data in files.items()}

    @app.get(prefix + DASHBOARD)
    async def dashboard_root() -> Response:
        return redirect(prefix + DASHBOARD + "/", 308)  # type: ignore[return-value]

    @app.get(prefix + DASHBOARD + "/")
    @app.get(prefix + DASHBOARD + "/<path:name>")
    async def dashboard_file(name: str = "index.html") -> Response:
        data = files.get(name)
        if data is None:
            body = error_body("File Not Found", "not_found_error")
            return Response(body, status=404, content_type=JSON_TYPE)
        etag = etags[name]
        if request.if_none_match.contains(etag):
            return Response(b"", status=304)
        ext = name[name.rfind(".") :]
        response = Response(data, content_type=_TYPES[ext])
        response.set_etag(etag)
        response.headers["Cache-Control"] = "no-cache"  # revalidate: a new troupe, new files
        return response
