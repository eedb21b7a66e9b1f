"""A model's context and memory need: one figure, wherever it is shown.

The router admits a model by its memory need (`troupe.sched.admission`); ``troupe
doctor``, ``troupe models``, ``GET /models`` and the dashboard show that need and the
context the child starts with. Both are computed here, for the child's own command line:

- the KV store (``--kv-store on``, the default) gives a sliding-window model such as
  Gemma 3 ``--swa-full`` (a restored slot is reused only with it), which multiplies its
  KV cache (Gemma 3 270M at 32k: 133 -> 576 MiB), so a figure made without it is not
  the router's (`kv_swa_full`, `with_kv_layout`);
- the context is ``--ctx-size``, else the model's trained context, which the engine's
  fit (on by default) lowers only when memory is short, to ``--fit-ctx`` at least
  (`child_context`);
- the need is the engine's own projection with the child's arguments once made
  (`troupe.actors.measure`, run by the router and by doctor with
  `troupe.specs.projection_argv`), else the GGUF header's estimate (`estimated_need`).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from troupe.catalog.entry import ModelEntry
from troupe.catalog.facts import FactsCache
from troupe.catalog.memory import model_need
from troupe.catalog.values import is_falsey
from troupe.gguf import ModelFacts
from troupe.hardware.estimate import DEFAULT_FIT_CTX

__all__ = ["Context", "child_context", "estimated_need", "kv_swa_full", "with_kv_layout"]

SWA_FULL = "--swa-full"


@attrs.frozen
class Context:
    """The context a model's child starts with, and why that one."""

    n_ctx: int
    why: str

    def __str__(self) -> str:
        return f"{self.n_ctx} ({self.why})"

    def to_json(self) -> dict[str, object]:
        return {"n_ctx": self.n_ctx, "why": self.why}


def _facts(entry: ModelEntry, facts: FactsCache) -> ModelFacts | None:
    if entry.model_path is None:
        return None
    found = facts.facts(entry.model_path)
    return found if isinstance(found, ModelFacts) and not found.rejection else None


def _int(entry: ModelEntry, env: str) -> int | None:
    raw = entry.preset.get(env)
    try:
        return int(raw) if raw is not None and raw.strip() else None
    except ValueError:
        return None


def kv_swa_full(entry: ModelEntry, facts: FactsCache, kv_store: bool) -> bool:
    """Whether the KV store gives ``entry``'s child ``--swa-full``: the store is on
    (``kv_store``), the model's preset leaves it in, and the model uses sliding-window
    attention."""
    if not kv_store or not entry.kv_store:
        return False
    found = _facts(entry, facts)
    return found is not None and found.swa_window > 0


def with_kv_layout(args: Sequence[str], swa_full: bool) -> list[str]:
    """``args`` with what the KV store adds to the KV layout (``--swa-full``)."""
    args = list(args)
    return [*args, SWA_FULL] if swa_full and SWA_FULL not in args else args


def child_context(entry: ModelEntry, facts: FactsCache) -> Context | None:
    """The context ``entry``'s child starts with; None when its file cannot say."""
    found = _facts(entry, facts)
    ctx = _int(entry, "LLAMA_ARG_CTX_SIZE")
    if ctx is not None and ctx > 0:
        return Context(ctx, "ctx-size")
    trained = found.context_length if found is not None else None
    if not trained:
        return None
    if ctx == 0:
        return Context(trained, "trained, ctx-size 0")
    if is_falsey(entry.preset.get("LLAMA_ARG_FIT") or ""):
        return Context(trained, "trained, fit off")
    fit_ctx = _int(entry, "LLAMA_ARG_FIT_CTX") or DEFAULT_FIT_CTX
    if trained > fit_ctx:
        return Context(trained, f"trained; fit may lower it to {fit_ctx}")
    return Context(trained, "trained")


def estimated_need(
    entry: ModelEntry, facts: FactsCache, gpus: Sequence[str] = (), *, kv_store: bool
) -> dict[str, int] | None:
    """The GGUF header's estimate for the child's own KV layout (the router's fallback
    when the engine cannot project)."""
    return model_need(entry, facts, gpus, swa_full=kv_swa_full(entry, facts, kv_store))
