"""Ollama's ``name:tag`` over troupe's catalogue.

Ollama names a model ``[namespace/]model[:tag]``, the tag ``latest`` when none is
given. troupe's catalogue has names (``gemma-3-270m``; ``org/repo:TAG`` for a
Hugging Face cache model), aliases and tags. A name asked for is looked up in turn:
as given (a name or an alias); without ``:latest``; as ``name:TAG`` where ``TAG``
is one of that entry's tags; ``org/repo`` (or ``org/repo:latest``) as the one cache
model of that repository. `/api/tags` lists every entry under `listed_name`, which
resolves back to it.
"""

from __future__ import annotations

from troupe.catalog import Catalog, ModelEntry

__all__ = ["LATEST", "listed_name", "resolve"]

LATEST = "latest"


def listed_name(entry: ModelEntry) -> str:
    """The name `/api/tags` shows: troupe's, with ``:latest`` when it has no tag of its own
    (Ollama's clients show and send names in that form)."""
    return entry.name if ":" in entry.name.rsplit("/", 1)[-1] else f"{entry.name}:{LATEST}"


def resolve(catalog: Catalog, name: str) -> ModelEntry | None:
    """The entry an Ollama client means by ``name``, or None."""
    if not name:
        return None
    found = catalog.resolve(name)
    if found is not None:
        return found
    base, sep, tag = name.rpartition(":")
    if not sep or "/" in tag:
        base, tag = name, LATEST  # no tag (a colon, if any, was in the namespace)
    if tag == LATEST:
        found = catalog.resolve(base)
        if found is not None:
            return found
    else:
        entry = catalog.resolve(base)
        if entry is not None and tag in entry.tags:
            return entry
    if tag == LATEST and base.count("/") == 1:
        # org/repo: the repository's one cache model (org/repo:TAG), if there is one.
        prefix = base + ":"
        same = [e for e in catalog if e.name.startswith(prefix)]
        if len(same) == 1:
            return same[0]
    return None
