"""CORS headers exactly as llama-server sets them, and the Origin check.

The Origin check (`OriginCheck`) is troupe's, as Ollama's: a browser request whose
``Origin`` is not allowed is refused with 403 before any handler runs, whatever its
method or content type, so a web page the user visits can neither read troupe's
answers nor make it act (a "simple" ``text/plain`` POST to ``/models/unload`` or
``/api/pull``, a WebSocket to ``/v1/realtime``). CORS headers alone only hide the
answer from the page: the request has run by then. Allowed: no ``Origin`` at all
(curl, SDKs, servers), a loopback origin (``localhost``, ``*.localhost``, 127.0.0.0/8,
``[::1]``, ``0.0.0.0``; any scheme of http/https, any port), the request's own host
(the dashboard troupe serves, a reverse proxy's public name), and what an explicit
``--cors-origins`` lists (``*``: any origin).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from troupe.http.hosts import host_name
from troupe.settings.router import RouterSettings

__all__ = [
    "OriginCheck",
    "allow_origin_headers",
    "origin_is_localhost",
    "preflight_headers",
]


def origin_is_localhost(origin: str) -> bool:
    try:
        host = urlsplit(origin).hostname or ""
    except ValueError:
        return False
    return host in ("localhost", "127.0.0.1", "::1")


def allow_origin_headers(settings: RouterSettings, origin: str | None) -> list[tuple[bytes, bytes]]:
    """``Access-Control-Allow-Origin`` for every response."""
    if settings.cors_credentials and settings.cors_origins == "*":
        # Echo the Origin so credentialed requests from any origin work; none without one
        # (llama-server echoes an empty value, which is no valid header).
        return [(b"access-control-allow-origin", origin.encode("latin-1"))] if origin else []
    if settings.cors_origins == "localhost":
        if origin and origin_is_localhost(origin):
            return [(b"access-control-allow-origin", origin.encode("latin-1"))]
        return []
    return [(b"access-control-allow-origin", settings.cors_origins.encode("latin-1"))]


def preflight_headers(settings: RouterSettings) -> list[tuple[bytes, bytes]]:
    return [
        (b"access-control-allow-credentials", b"true" if settings.cors_credentials else b"false"),
        (b"access-control-allow-methods", settings.cors_methods.encode("latin-1")),
        (b"access-control-allow-headers", settings.cors_headers.encode("latin-1")),
    ]


def _loopback_name(host: str) -> bool:
    if host in ("localhost", "0.0.0.0") or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _normal(origin: str) -> str:
    return origin.strip().rstrip("/").lower()


class OriginCheck:
    """Which browser origins may make requests at all (see the module's docstring)."""

    def __init__(self, listed: Iterable[str]) -> None:
        origins = {_normal(o) for o in listed if o.strip()}
        self.any = "*" in origins
        self.listed = frozenset(origins)
        self._seen: dict[tuple[str, bytes], bool] = {}  # (origin, Host) -> verdict

    def allows(self, origin: str | None, authority: bytes) -> bool:
        """``origin``: the request's ``Origin`` (None: none sent); ``authority``: its Host."""
        if origin is None or self.any:
            return True
        key = (origin, authority)
        verdict = self._seen.get(key)
        if verdict is None:
            verdict = self._decide(origin, authority)
            if len(self._seen) < 256:
                self._seen[key] = verdict
        return verdict

    def _decide(self, origin: str, authority: bytes) -> bool:
        if _normal(origin) in self.listed:
            return True
        try:
            parts = urlsplit(origin.strip())
            host = (parts.hostname or "").rstrip(".")
        except ValueError:
            return False
        if parts.scheme not in ("http", "https") or not host:
            return False  # "null" (a sandboxed frame, a file), an extension's scheme
        return _loopback_name(host) or (bool(authority) and host == host_name(authority))
