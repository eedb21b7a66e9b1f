"""Per-architecture facts that are not in the GGUF metadata itself.

Mirrors the pinned llama.cpp (``src/models/*.cpp``, ``src/llama-model.cpp``)
and Jan's embedding detection (its ``detectEmbeddingFromGgufMeta``). When the engine
is upgraded, re-check these tables against its source.
"""

from __future__ import annotations

import attrs

__all__ = [
    "EMBEDDING_ARCHS",
    "NO_KV_CACHE_ARCHS",
    "SWA_RULES",
    "SwaRule",
    "kv_layers_from_start",
    "swa_pattern",
]

# Jan's EMBEDDING_GGUF_ARCHS (util.ts) plus the newer import dialog's additions.
EMBEDDING_ARCHS = frozenset(
    {
        "bert",
        "nomic-bert",
        "nomic-bert-moe",
        "jina-bert-v2",
        "jina-bert-v3",
        "xlm-roberta",
        "mpnet",
        "t5encoder",
        "gemma-embedding",
        "pangu-embedded",
        "llama-embed",
    }
)

# llama_model::create_memory returns no memory module for these (non-causal).
NO_KV_CACHE_ARCHS = frozenset(
    {
        "bert",
        "jina-bert-v2",
        "jina-bert-v3",
        "nomic-bert",
        "nomic-bert-moe",
        "neo-bert",
        "eurobert",
        "wavtokenizer-dec",
        "modern-bert",
        "gemma-embedding",
        "dream",
        "llada",
        "llada-moe",
        "rnd1",
        "clef",
    }
)


@attrs.frozen
class SwaRule:
    """How one architecture turns on sliding-window attention.

    `period`: ``load_swa_pattern(ml, period, dense_first)`` default, used when the
    file has no ``{arch}.attention.sliding_window_pattern``. `needs_window`: SWA is
    on only if ``{arch}.attention.sliding_window`` > 0 (else always on).
    `default_window` applies when the key is absent; `forced_window` overrides it.
    """

    period: int
    dense_first: bool = False
    needs_window: bool = False
    default_window: int = 0
    forced_window: int = 0
    only_block_count: int = 0  # exaone4: SWA only for the 64-layer (32B) model


SWA_RULES: dict[str, SwaRule] = {
    "gemma2": SwaRule(2, default_window=4096),
    "gemma3": SwaRule(6, needs_window=True),
    "gemma3n": SwaRule(5),
    "gemma4": SwaRule(0),  # the file carries a per-layer pattern
    "cohere2": SwaRule(4),
    "cohere2moe": SwaRule(4, dense_first=True),
    "gpt-oss": SwaRule(2),
    "llama4": SwaRule(4, default_window=8192),  # chunked; a window of 0 turns it off
    "exaone4": SwaRule(4, default_window=4096, only_block_count=64),
    "exaone-moe": SwaRule(4, default_window=128),
    "olmo2": SwaRule(4, needs_window=True),
    "plamo3": SwaRule(8, needs_window=True),
    "smallthinker": SwaRule(4, dense_first=True, needs_window=True, forced_window=4096),
    "afmoe": SwaRule(4, needs_window=True),
    "mellum": SwaRule(4, needs_window=True),
    "laguna": SwaRule(4, dense_first=True, needs_window=True),
    "muse-glimmer": SwaRule(4),
}


def _expand(period: int, dense_first: bool, n_layer: int) -> tuple[bool, ...]:
    """llama_hparams::set_swa_pattern."""
    if dense_first:
        return tuple(period == 0 or il % period != 0 for il in range(n_layer))
    return tuple(period == 0 or il % period < period - 1 for il in range(n_layer))


def swa_pattern(
    arch: str,
    n_layer: int,
    window: int | None,
    pattern: object,
) -> tuple[int, tuple[bool, ...]] | None:
    """The effective SWA window and per-layer flags, or None when SWA is off.

    `window` is ``{arch}.attention.sliding_window`` (None if absent); `pattern`
    is ``{arch}.attention.sliding_window_pattern`` as read (int period, tuple of
    bools, or None). `n_layer` counts the trunk layers (MTP layers excluded;
    they are never SWA). An architecture without a rule uses SWA only when the
    file gives an explicit per-layer pattern and a positive window.
    """
    rule = SWA_RULES.get(arch)
    if rule is None:
        if isinstance(pattern, tuple) and window and any(pattern):
            return window, _flags(pattern, n_layer)
        return None
    if rule.only_block_count and n_layer != rule.only_block_count:
        return None
    if rule.needs_window and not window:
        return None
    if arch == "llama4" and window == 0:
        return None
    w = rule.forced_window or (window if window is not None else rule.default_window)
    if not w:
        return None
    if isinstance(pattern, tuple):
        flags = _flags(pattern, n_layer)
    elif isinstance(pattern, int) and not isinstance(pattern, bool):
        flags = _expand(pattern, rule.dense_first, n_layer)
    else:
        flags = _expand(rule.period, rule.dense_first, n_layer)
    return (w, flags) if any(flags) else None


def _flags(pattern: tuple[object, ...], n_layer: int) -> tuple[bool, ...]:
    flags = tuple(bool(x) for x in pattern[:n_layer])
    return flags + (False,) * (n_layer - len(flags))


def kv_layers_from_start(arch: str, block_count: int, shared_kv_layers: int | None) -> int | None:
    """``n_layer_kv_from_start``: later layers reuse earlier KV caches (None: all own one)."""
    if arch == "gemma3n":
        return 20
    if arch == "gemma4":
        return max(0, block_count - (shared_kv_layers or 0))
    return None
