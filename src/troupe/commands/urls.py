"""The router a command asks (``troupe ps``, ``troupe models``): ``--url`` as a person
types it, else ``$TROUPE_URL``, else the default address ``troupe serve`` listens on."""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["DEFAULT_URL", "default_url", "router_url"]

DEFAULT_URL = "http://127.0.0.1:8080"


def router_url(text: str) -> str:
    """A base URL: ``localhost:8080`` (no scheme, as ``troupe serve`` prints host and
    port) is ``http://localhost:8080``; a trailing slash is dropped."""
    text = text.strip()
    if "://" not in text:
        text = "http://" + text
    return text.rstrip("/")


def default_url(environ: Mapping[str, str] | None = None) -> str:
    env = os.environ if environ is None else environ
    return router_url(env.get("TROUPE_URL") or DEFAULT_URL)
