"""troupe's memory estimate for a catalog model: weights + KV cache + projector.

This is the input `feasibility` wants, computed from the GGUF header and the
model's preset (its options as the child would get them). It leaves out the
compute buffer and recurrent state, so it is a floor, not a measurement.

The context it sizes the KV cache for is the *smallest* the engine may run
the model with, because the question is "can it run at all":

* ``ctx-size N`` set: N (``0`` means the trained context); fit never changes a
  context the user set.
* fit off: the trained context, since nothing will shrink it.
* otherwise fit starts at the trained context and shrinks it, when memory is
  short, down to ``fit-ctx`` (default 4096) and no further: ``min(trained, fit-ctx)``.
"""

from __future__ import annotations

from typing import Protocol

import attrs

from troupe.gguf import ModelFacts, kv_cache_bytes
from troupe.settings.flags import is_falsey, is_truthy

__all__ = ["DEFAULT_FIT_CTX", "MemoryEstimate", "context_for", "estimate_memory"]

DEFAULT_FIT_CTX = 4096  # llama.cpp common.h: fit_params_min_ctx
AUTO_PARALLEL = 4  # llama-server's slot count for --parallel -1 (auto), with a unified cache


class Preset(Protocol):
    """A model's options as the child would get them (`troupe.catalog.preset.Preset`)."""

    def get(self, env: str) -> str | None:
        """The value of the option whose environment name is ``env``."""


@attrs.frozen
class MemoryEstimate:
    weights: int  # tensor bytes of the shards that were read
    kv_cache: int
    mmproj: int
    n_ctx: int
    context_reason: str

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.mmproj


def _int(preset: Preset, env: str) -> int | None:
    raw = preset.get(env)
    if raw is None or not raw.strip():
        return None
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError(f"{env} is not an integer: {raw!r}") from None


def context_for(preset: Preset, facts: ModelFacts) -> tuple[int, str]:
    """``(n_ctx, why)``: the context the estimate is made at (see the module text)."""
    trained = facts.context_length
    ctx = _int(preset, "LLAMA_ARG_CTX_SIZE")
    if ctx is not None and ctx > 0:
        return ctx, "ctx-size"
    if ctx == 0 or is_falsey(preset.get("LLAMA_ARG_FIT") or ""):
        if not trained:
            raise ValueError("the model does not state its trained context")
        return trained, "trained, ctx-size 0" if ctx == 0 else "trained, fit off"
    fit_ctx = _int(preset, "LLAMA_ARG_FIT_CTX") or DEFAULT_FIT_CTX
    if trained and trained <= fit_ctx:
        return trained, f"trained, within fit-ctx {fit_ctx}"
    return fit_ctx, "fit-ctx, the least fit may choose"


def estimate_memory(
    preset: Preset, facts: ModelFacts, mmproj_bytes: int = 0, *, swa_full: bool = False
) -> MemoryEstimate:
    """The estimate for a model with `facts` run with `preset`; ValueError on bad options."""
    n_ctx, why = context_for(preset, facts)
    parallel = _int(preset, "LLAMA_ARG_N_PARALLEL")
    unified_raw = preset.get("LLAMA_ARG_KV_UNIFIED")
    if parallel is None or parallel < 1:  # auto: 4 slots sharing one cache
        n_seq, unified = AUTO_PARALLEL, True
    else:
        n_seq, unified = parallel, unified_raw is not None and is_truthy(unified_raw)
    kv = kv_cache_bytes(
        facts,
        n_ctx,
        n_seq,
        type_k=preset.get("LLAMA_ARG_CACHE_TYPE_K") or "f16",
        type_v=preset.get("LLAMA_ARG_CACHE_TYPE_V") or "f16",
        # ``swa_full``: the KV store adds --swa-full to the child (troupe.kvstore).
        swa_full=swa_full or is_truthy(preset.get("LLAMA_ARG_SWA_FULL") or ""),
        n_ubatch=_int(preset, "LLAMA_ARG_UBATCH") or 512,
        unified=unified,
        flash_attn=preset.get("LLAMA_ARG_FLASH_ATTN") not in ("off", "0", "false", "disabled"),
    )
    return MemoryEstimate(facts.tensor_bytes, kv, mmproj_bytes, n_ctx, why)
