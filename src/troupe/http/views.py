"""What a tenant that is not admin sees of the operator's views, with a tenants file:
only the models it may use (`troupe.tenants.model.Tenants.allows`, by name and alias)
and only its own per-tenant series. ``GET /metrics`` drops every sample whose ``model``
label names a model the key may not use and whose ``tenant`` label is another tenant's;
``GET /troupe/history`` keeps only its models' memory. An admin, and every key without a
tenants file, sees everything (a Prometheus scrape takes an admin's key)."""

from __future__ import annotations

import re
from collections.abc import Callable

from troupe.assembly import Troupe

__all__ = ["filter_exposition", "model_filter"]

_MODEL = re.compile(rb'[{,]model="((?:[^"\\]|\\.)*)"')
_TENANT = re.compile(rb'[{,]tenant="((?:[^"\\]|\\.)*)"')


def model_filter(ctx: Troupe, key_name: str) -> Callable[[str], bool] | None:
    """Which models the request's key may see in an operator's view; None: every model
    (no tenants file, no key, or an admin)."""
    tenants = ctx.tenants.current
    if not tenants.from_file or not key_name or tenants.may_admin(key_name):
        return None
    seen: dict[str, bool] = {}

    def visible(name: str) -> bool:
        found = seen.get(name)
        if found is None:
            entry = ctx.catalog.resolve(name)
            names = (name,) if entry is None else (entry.name, *entry.aliases)
            found = seen[name] = tenants.allows(key_name, names)
        return found

    return visible


def _unescape(value: bytes) -> str:
    text = value.decode("utf-8", "replace")
    if "\\" not in text:
        return text
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), text)


def filter_exposition(body: bytes, visible: Callable[[str], bool], tenant: str) -> bytes:
    """``body`` (Prometheus' text format) without the samples of a model not
    ``visible`` or of a tenant other than ``tenant`` (comment lines stay)."""
    kept = []
    for line in body.split(b"\n"):
        if line and not line.startswith(b"#"):
            model = _MODEL.search(line)
            if model is not None and not visible(_unescape(model.group(1))):
                continue
            other = _TENANT.search(line)
            if other is not None and _unescape(other.group(1)) != tenant:
                continue
        kept.append(line)
    return b"\n".join(kept)
