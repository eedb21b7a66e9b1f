"""GGUF: a fast header-only reader and the model facts troupe derives from it.

Pure, synchronous code: call it from a worker thread (``trio.to_thread``) when
reading many files from an actor.
"""

from __future__ import annotations

from troupe.gguf.capabilities import (
    input_modalities,
    is_embedding_model,
    mmproj_modalities,
    output_modalities,
    read_mmproj_modalities,
)
from troupe.gguf.facts import ModelFacts, model_facts, read_model_facts, shard_paths
from troupe.gguf.header import GGUFError, read_header
from troupe.gguf.kvcache import (
    KVCacheEstimate,
    cache_type,
    kv_bytes_per_token,
    kv_cache_bytes,
    kv_cache_estimate,
)
from troupe.gguf.records import Field, GGUFHeader, SkippedArray, TensorInfo

__all__ = [
    "Field",
    "GGUFError",
    "GGUFHeader",
    "KVCacheEstimate",
    "ModelFacts",
    "SkippedArray",
    "TensorInfo",
    "cache_type",
    "input_modalities",
    "is_embedding_model",
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "kv_cache_estimate",
    "mmproj_modalities",
    "model_facts",
    "output_modalities",
    "read_header",
    "read_mmproj_modalities",
    "read_model_facts",
    "shard_paths",
]
