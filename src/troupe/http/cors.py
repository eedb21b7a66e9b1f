"""CORS headers exactly as llama-server sets them (spec §3.1)."""

from __future__ import annotations

from urllib.parse import urlsplit

from troupe.settings.router import RouterSettings

__all__ = ["allow_origin_headers", "origin_is_localhost", "preflight_headers"]


def origin_is_localhost(origin: str) -> bool:
    try:
        host = urlsplit(origin).hostname or ""
    except ValueError:
        return False
    return host in ("localhost", "127.0.0.1", "::1")


def allow_origin_headers(settings: RouterSettings, origin: str | None) -> list[tuple[bytes, bytes]]:
    """``Access-Control-Allow-Origin`` for every response."""
    if settings.cors_credentials and settings.cors_origins == "*":
        # Echo the Origin (even an empty one) so credentialed requests from any origin work.
        return [(b"access-control-allow-origin", (origin or "").encode("latin-1"))]
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
