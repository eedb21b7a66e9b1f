"""KV-cache size as the pinned llama.cpp allocates it (``llama-kv-cache.cpp``).

Context sizing (``llama-context.cpp``): ``n_ctx = 0`` means the training
context; ``n_ctx`` is padded to 256; with a unified cache there is one stream of
``n_ctx`` cells, else ``n_seq`` streams of ``PAD(n_ctx / n_seq, 256)`` cells.

Per attention layer (``llama-kv-cache.cpp``): K is ``[n_embd_k_gqa(il), cells,
n_stream]`` of `type_k`, V likewise of `type_v` (absent for MLA; padded to the
widest layer without flash attention). SWA layers (``llama-kv-cache-iswa.cpp``)
get ``PAD(min(cells, n_swa * (unified ? n_seq : 1) + n_ubatch), 256)`` cells
unless `swa_full`. MTP layers are left out of the main context; layers past
``kv_layers_from_start`` reuse earlier caches.

Not counted: recurrent/SSM state (Mamba, RWKV, hybrid models' recurrent
layers), sparse-attention indexer caches (DSA/MSA), and buffer alignment.
"""

from __future__ import annotations

import attrs

from troupe.gguf.arch import NO_KV_CACHE_ARCHS
from troupe.gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from troupe.gguf.facts import ModelFacts

__all__ = [
    "CACHE_TYPES",
    "KVCacheEstimate",
    "cache_type",
    "context_cells",
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "kv_cache_estimate",
]

_Q = GGMLQuantizationType
# the -ctk/-ctv values llama-server accepts (common/arg.cpp kv_cache_types)
CACHE_TYPES: dict[str, GGMLQuantizationType] = {
    "f32": _Q.F32,
    "f16": _Q.F16,
    "bf16": _Q.BF16,
    "q8_0": _Q.Q8_0,
    "q4_0": _Q.Q4_0,
    "q4_1": _Q.Q4_1,
    "iq4_nl": _Q.IQ4_NL,
    "q5_0": _Q.Q5_0,
    "q5_1": _Q.Q5_1,
}
CacheType = str | GGMLQuantizationType


def cache_type(t: CacheType) -> GGMLQuantizationType:
    """A cache type from its ``-ctk`` name (``"q8_0"``) or enum; ValueError if not allowed."""
    q = CACHE_TYPES.get(t.lower()) if isinstance(t, str) else t
    if q is None or q not in CACHE_TYPES.values():
        raise ValueError(f"unsupported cache type {t!r} (allowed: {', '.join(CACHE_TYPES)})")
    return q


def _row(t: GGMLQuantizationType, n: int) -> int:
    """ggml_row_size."""
    block, size = GGML_QUANT_SIZES[t]
    return size * n // block


def _pad(x: int, n: int) -> int:
    return (x + n - 1) // n * n


@attrs.frozen
class KVCacheEstimate:
    k_bytes: int
    v_bytes: int
    cells: int  # per stream, full-attention layers
    swa_cells: int  # per stream, SWA layers (0 when none)
    n_stream: int

    @property
    def total(self) -> int:
        return self.k_bytes + self.v_bytes


def context_cells(facts: ModelFacts, n_ctx: int, n_seq: int, unified: bool) -> tuple[int, int]:
    """``(cells per stream, n_stream)`` for a context of `n_ctx` (0: training context)."""
    if n_seq < 1:
        raise ValueError(f"n_seq must be >= 1, got {n_seq}")
    if n_ctx == 0:
        if not facts.context_length:
            raise ValueError("n_ctx = 0 needs the model's context_length, which is missing")
        n_ctx = facts.context_length
    n_ctx = _pad(n_ctx, 256)
    if unified:
        return n_ctx, 1
    per_seq = _pad(n_ctx // n_seq, 256)
    if per_seq == 0:
        raise ValueError(f"n_ctx {n_ctx} is too small for {n_seq} sequences")
    return per_seq, n_seq


def _head_dims(facts: ModelFacts) -> tuple[int, int, int, int]:
    """(k_full, v_full, k_swa, v_swa) head sizes, with llama.cpp's fallbacks."""
    heads = facts.per_layer(facts.head_count)
    n_head0 = heads[0] if heads else 0
    if n_head0 <= 0:
        return 0, 0, 0, 0
    default = (facts.embedding_length or 0) // n_head0
    k = facts.key_length if facts.key_length is not None else default
    v = facts.value_length if facts.value_length is not None else default
    k_swa = facts.key_length_swa if facts.key_length_swa is not None else k
    v_swa = facts.value_length_swa if facts.value_length_swa is not None else v
    return k, v, k_swa, v_swa


def _layer_widths(facts: ModelFacts) -> list[tuple[bool, int, int]]:
    """``(is_swa, n_embd_k_gqa, n_embd_v_gqa)`` of each layer that owns a KV cache."""
    if facts.architecture in NO_KV_CACHE_ARCHS:
        return []
    k, v, k_swa, v_swa = _head_dims(facts)
    kv_heads = facts.per_layer(facts.head_count_kv)
    swa = facts.swa_layers or ()
    n_layer = facts.n_layer if facts.mtp_layers and facts.n_layer else len(kv_heads)
    if facts.kv_layers_from_start is not None:
        n_layer = min(n_layer, max(0, facts.kv_layers_from_start))
    out = []
    for il in range(n_layer):
        is_swa = il < len(swa) and swa[il]
        hk, hv = (k_swa, v_swa) if is_swa else (k, v)
        out.append((is_swa, hk * kv_heads[il], 0 if facts.is_mla else hv * kv_heads[il]))
    return out


def kv_cache_estimate(
    facts: ModelFacts,
    n_ctx: int,
    n_seq: int = 1,
    *,
    type_k: CacheType = "f16",
    type_v: CacheType = "f16",
    swa_full: bool = False,
    n_ubatch: int = 512,
    unified: bool = True,
    flash_attn: bool = True,
) -> KVCacheEstimate:
    """The KV cache llama.cpp would allocate, split into K and V bytes."""
    tk, tv = cache_type(type_k), cache_type(type_v)
    cells, n_stream = context_cells(facts, n_ctx, n_seq, unified)
    layers = _layer_widths(facts)
    swa_cells = 0
    if any(s for s, _, _ in layers):
        swa_cells = cells
        if not swa_full:
            window = facts.swa_window * (n_seq if unified else 1) + n_ubatch
            swa_cells = _pad(min(cells, window), 256)
    v_max = max((v for _, _, v in layers), default=0)
    k_bytes = v_bytes = 0
    for is_swa, nk, nv in layers:
        c = (swa_cells if is_swa else cells) * n_stream
        k_bytes += _row(tk, nk) * c
        if nv:
            v_bytes += _row(tv, nv if flash_attn else v_max) * c
    return KVCacheEstimate(k_bytes, v_bytes, cells, swa_cells, n_stream)


def kv_cache_bytes(
    facts: ModelFacts,
    n_ctx: int,
    n_seq: int = 1,
    *,
    type_k: CacheType = "f16",
    type_v: CacheType = "f16",
    swa_full: bool = False,
    n_ubatch: int = 512,
    unified: bool = True,
    flash_attn: bool = True,
) -> int:
    """Total KV-cache bytes; see `kv_cache_estimate`."""
    est = kv_cache_estimate(
        facts,
        n_ctx,
        n_seq,
        type_k=type_k,
        type_v=type_v,
        swa_full=swa_full,
        n_ubatch=n_ubatch,
        unified=unified,
        flash_attn=flash_attn,
    )
    return est.total


def kv_bytes_per_token(
    facts: ModelFacts, type_k: CacheType = "f16", type_v: CacheType = "f16"
) -> int:
    """Bytes one cell costs summed over every KV layer (as if every layer were full-size)."""
    tk, tv = cache_type(type_k), cache_type(type_v)
    return sum(_row(tk, nk) + _row(tv, nv) for _, nk, nv in _layer_widths(facts))
