"""The dashboard's routes: ``/troupe`` redirects to ``/troupe/``, whose files are served
with an ETag (revalidated on each load: a new troupe brings new files)."""

from __future__ import annotations

import functools
import hashlib
import html
import re

from troupe.assembly import Troupe
from troupe.http.errors import NOT_FOUND_BODY
from troupe.http.routing import DASHBOARD
from troupe.http.server.exchange import Exchange
from troupe.ops.dashboard import CONTENT_TYPES, load_static

__all__ = ["dashboard_file", "dashboard_root", "etag_matches"]

# An entity tag in If-None-Match: optionally weak, quoted or not, comma-separated.
_ETAG = re.compile(r'([Ww]/)?(?:"(.*?)"|(.*?))(?:\s*,\s*|$)')
_HTML = "text/html; charset=utf-8"


@functools.cache
def _files() -> tuple[dict[str, bytes], dict[str, str]]:
    files = load_static()
    return files, {name: hashlib.sha256(data).hexdigest()[:16] for name, data in files.items()}


def etag_matches(header: str | None, etag: str) -> bool:
    """``If-None-Match: header`` names ``etag`` (a strong match, or ``*``)."""
    pos = 0
    while header and pos < len(header):
        found = _ETAG.match(header, pos)
        if found is None or found.end() == pos:
            break
        weak, quoted, raw = found.groups()
        if raw == "*":
            return True
        if not weak and (quoted if quoted is not None else raw) == etag:
            return True
        pos = found.end()
    return False


async def _redirect(ex: Exchange, location: str) -> None:
    shown = html.escape(location)
    body = (
        "<!doctype html>\n<html lang=en>\n<title>Redirecting...</title>\n"
        "<h1>Redirecting...</h1>\n<p>You should be redirected automatically to the target"
        f' URL: <a href="{shown}">{shown}</a>. If not, click the link.\n'
    ).encode()
    await ex.respond(308, body, _HTML, [(b"Location", location.encode("latin-1"))])


async def dashboard_root(router: Troupe, ex: Exchange) -> None:
    await _redirect(ex, router.settings.api_prefix + DASHBOARD + "/")


async def dashboard_file(router: Troupe, ex: Exchange) -> None:
    prefix = router.settings.api_prefix
    route = ex.path[len(prefix) :]
    if "//" in route:  # one file, one path: repeated slashes redirect to the merged one
        await _redirect(ex, prefix + re.sub("/{2,}", "/", route))
        return
    name = route[len(DASHBOARD) + 1 :] or "index.html"
    files, etags = _files()
    data = files.get(name)
    if data is None:
        await ex.respond(404, NOT_FOUND_BODY)
        return
    etag = etags[name]
    if etag_matches(ex.header(b"if-none-match"), etag):
        await ex.respond(304, b"", _HTML)
        return
    headers = [(b"ETag", f'"{etag}"'.encode()), (b"Cache-Control", b"no-cache")]
    await ex.respond(200, data, CONTENT_TYPES[name[name.rfind(".") :]], headers)
