"""What loading a catalog model takes, per device, before it is loaded.

The GGUF estimate (weights, KV cache at the context the engine would run with,
projector; `troupe.hardware.estimate`) plus the two buffers llama.cpp allocates
beside them: the compute buffer (sized for one micro-batch: the FFN and residual
activations and the attention mask) and the output buffer (one row of logits per
sequence). Checked against llama-server's own buffer sizes (``-lv 4``): within 5%
for the tiny test models and Gemma 3 270M (bench/memory.py prints the comparison).
"""

from __future__ import annotations

from collections.abc import Sequence

from troupe.catalog.entry import ModelEntry
from troupe.catalog.facts import FactsCache
from troupe.catalog.values import is_falsey
from troupe.gguf import ModelFacts
from troupe.hardware.estimate import MemoryEstimate, estimate_memory

__all__ = ["HOST", "compute_bytes", "model_need"]

HOST = "host"
F32 = 4


def _preset_int(entry: ModelEntry, env: str, default: int) -> int:
    raw = entry.preset.get(env)
    try:
        return int(raw) if raw is not None and raw.strip() else default
    except ValueError:
        return default


def compute_bytes(facts: ModelFacts, n_ctx: int, n_seq: int, n_batch: int, n_ubatch: int) -> int:
    """Compute buffer plus output buffer, as llama.cpp reserves them."""
    ubatch = max(1, min(n_ubatch, n_batch, n_ctx))
    n_embd = facts.embedding_length or 0
    n_ff = facts.feed_forward_length or 4 * n_embd
    activations = ubatch * F32 * (3 * n_ff + 6 * n_embd)
    mask = n_ctx * ubatch * 2  # the KQ mask, f16, one row per token of the micro-batch
    logits = (facts.vocab_size or 0) * F32 * max(1, n_seq)
    return activations + mask + logits


def model_need(
    entry: ModelEntry, facts_cache: FactsCache, gpus: Sequence[str] = (), *, swa_full: bool = False
) -> dict[str, int] | None:
    """Bytes per device ("host", "cuda:0", ...) to load ``entry``; None when unknown.

    With GPUs, layers go to the first GPU as ``--n-gpu-layers`` says (auto: all of
    them, which is what fit tries first); the rest stays on the host. A tensor split
    over several GPUs is not modelled: the first GPU is charged, the safe side.
    """
    facts = facts_cache.facts(entry.model_path)
    if not isinstance(facts, ModelFacts) or facts.rejection:
        return None
    mmproj = 0
    if entry.mmproj_path is not None:
        try:
            mmproj = entry.mmproj_path.stat().st_size
        except OSError:
            mmproj = 0
    try:
        est: MemoryEstimate = estimate_memory(entry.preset, facts, mmproj, swa_full=swa_full)
    except ValueError:
        return None
    parallel = _preset_int(entry, "LLAMA_ARG_N_PARALLEL", -1)
    n_seq = parallel if parallel > 0 else 4
    extra = compute_bytes(
        facts,
        est.n_ctx,
        n_seq,
        _preset_int(entry, "LLAMA_ARG_BATCH", 2048),
        _preset_int(entry, "LLAMA_ARG_UBATCH", 512),
    )
    if not gpus:
        return {HOST: est.total + extra}
    layers = facts.n_layer + 1  # + the output layer, as llama.cpp counts offload
    ngl = _preset_int(entry, "LLAMA_ARG_N_GPU_LAYERS", -1)
    on_gpu = layers if ngl < 0 else min(ngl, layers)
    share = on_gpu / layers
    kv_on_gpu = not is_falsey(entry.preset.get("LLAMA_ARG_KV_OFFLOAD") or "1")
    gpu = int(est.weights * share) + (int(est.kv_cache * share) if kv_on_gpu else 0)
    gpu += extra if on_gpu else 0
    host = est.total + extra - gpu
    return {gpus[0]: gpu, HOST: host} if gpu else {HOST: host}
