"""Ollama's ``name:tag`` over troupe's catalog.

Ollama names a model ``[namespace/]model[:tag]``, the tag ``latest`` when none is
given. troupe's catalog has names (``gemma-3-270m``; ``org/repo:TAG`` for a
Hugging Face cache model), aliases and tags. A name asked for is looked up in turn:
as given (a name or an alias); without ``:latest``; as ``name:TAG`` where ``TAG``
is one of that entry's tags; ``org/repo`` (or ``org/repo:latest``) as the one cache
model of that repository; then the same without regard to case (Ollama's names are
case-insensitive). ``hf.co/org/repo:TAG`` (Ollama's name for a Hugging Face model) is
``org/repo:TAG``. `/api/tags` lists every entry under `listed_name`, which resolves
back to it.
"""

from __future__ import annotations

from collections.abc import Callable

from troupe.catalog import Catalog, ModelEntry

__all__ = ["LATEST", "hub_name", "listed_name", "resolve"]

LATEST = "latest"
_HUB_PREFIXES = ("hf.co/", "huggingface.co/", "https://hf.co/", "https://huggingface.co/")


def hub_name(name: str) -> str:
    """``hf.co/org/repo:TAG`` (how Ollama names a Hugging Face model) as troupe's
    ``org/repo:TAG``; any other name as it is."""
    for prefix in _HUB_PREFIXES:
        if name.lower().startswith(prefix):
            return name[len(prefix) :]
    return name


def listed_name(entry: ModelEntry) -> str:
    """The name `/api/tags` shows: troupe's, with ``:latest`` when it has no tag of its own
    (Ollama's clients show and send names in that form)."""
    return entry.name if ":" in entry.name.rsplit("/", 1)[-1] else f"{entry.name}:{LATEST}"


def resolve(catalog: Catalog, name: str) -> ModelEntry | None:
    """The entry an Ollama client means by ``name``, or None."""
    name = hub_name(name)
    if not name:
        return None
    found = _resolve(catalog.resolve, catalog, name)
    if found is not None:
        return found
    folded: dict[str, ModelEntry] = {}
    for entry in catalog:  # name order: the first entry wins, as aliases do
        for known in (entry.name, *entry.sorted_aliases):
            folded.setdefault(known.lower(), entry)
    return _resolve(lambda n: folded.get(n.lower()), catalog, name)


def _resolve(
    lookup: Callable[[str], ModelEntry | None], catalog: Catalog, name: str
) -> ModelEntry | None:
    found = lookup(name)
    if found is not None:
        return found
    base, sep, tag = name.rpartition(":")
    if not sep or "/" in tag:
        base, tag = name, LATEST  # no tag (a colon, if any, was in the namespace)
    if tag.lower() == LATEST:
        found = lookup(base)
        if found is not None:
            return found
    else:
        entry = lookup(base)
        if entry is not None and tag.lower() in {t.lower() for t in entry.tags}:
            return entry
    if tag.lower() == LATEST and base.count("/") == 1:
        # org/repo: the repository's one cache model (org/repo:TAG), if there is one.
        prefix = base.lower() + ":"
        same = [e for e in catalog if e.name.lower().startswith(prefix)]
        if len(same) == 1:
            return same[0]
    return None
