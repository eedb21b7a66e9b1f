"""KV-cache bytes as llama.cpp allocates them (``llama-kv-cache.cpp``)."""

from __future__ import annotations

from typing import Any

import attrs
import gguf
import pytest

from troupe.gguf import (
    ModelFacts,
    cache_type,
    kv_bytes_per_token,
    kv_cache_bytes,
    kv_cache_estimate,
    model_facts,
    read_header,
)
from troupe.gguf.constants import GGMLQuantizationType

MiB = 1 << 20


@pytest.fixture
def tiny(files: Any) -> ModelFacts:
    """The tiny llama of conftest: 4 layers, 2 KV heads x 32 (n_embd 128 / 4 heads), ctx 512."""
    return model_facts(read_header(files.llama(tensors=False)))


def test_tiny_model_bytes_per_token(tiny: ModelFacts) -> None:
    assert kv_bytes_per_token(tiny) == 1024
    assert kv_bytes_per_token(tiny, "q8_0", "q8_0") == 544
    assert kv_bytes_per_token(tiny, "f32", "q4_0") == 4 * (64 * 4 + 64 // 32 * 18)


def test_tiny_model_measured_sizes(tiny: ModelFacts) -> None:
    # `-c 256`, 4 slots, unified: "size = 0.25 MiB (256 cells, 4 layers, 4/1 seqs), K 0.12, V 0.12"
    est = kv_cache_estimate(tiny, 256, 4, unified=True)
    assert est.total == 256 * 1024 == MiB // 4
    assert est.k_bytes == est.v_bytes == MiB // 8
    assert (est.cells, est.n_stream, est.swa_cells) == (256, 1, 0)
    # `-c 0` (n_ctx_train = 512), q8_0: "0.27 MiB (512 cells ...) K (q8_0): 0.13 MiB"
    q8 = kv_cache_estimate(tiny, 0, 1, type_k="q8_0", type_v="q8_0")
    assert q8.cells == 512
    assert q8.total == 512 * 544
    assert round(q8.total / MiB, 2) == 0.27
    assert round(q8.k_bytes / MiB, 2) == 0.13
    assert kv_cache_bytes(tiny, 0, type_k="q8_0", type_v="q8_0") == q8.total


def test_context_padding_and_streams(tiny: ModelFacts) -> None:
    assert kv_cache_bytes(tiny, 300) == 512 * 1024  # padded to 256
    # per-sequence streams: PAD(1000 -> 1024 / 3 = 341, 256) = 512 cells x 3 streams
    est = kv_cache_estimate(tiny, 1000, 3, unified=False)
    assert (est.cells, est.n_stream) == (512, 3)
    assert est.total == 512 * 3 * 1024
    # one sequence, not unified: one stream
    assert kv_cache_bytes(tiny, 1024, 1, unified=False) == 1024 * 1024
    # 256 over 2 sequences: each stream is padded back up to 256 cells
    assert kv_cache_estimate(tiny, 256, 2, unified=False).total == 2 * 256 * 1024
    with pytest.raises(ValueError, match="too small"):
        kv_cache_bytes(tiny, 256, 300, unified=False)
    with pytest.raises(ValueError, match="n_seq"):
        kv_cache_bytes(tiny, 256, 0)


def test_per_layer_kv_heads(files: Any) -> None:
    f = model_facts(read_header(files.llama(n_head_kv=[2, 2, 1, 0], tensors=False)))
    # 32-wide heads, f16, K + V: (2 + 2 + 1 + 0) x 32 x 2 bytes x 2
    assert kv_bytes_per_token(f) == 5 * 32 * 2 * 2


def test_cache_types() -> None:
    assert cache_type("Q8_0") is GGMLQuantizationType.Q8_0  # troupe's copy of gguf's enum
    assert cache_type("Q8_0") == gguf.GGMLQuantizationType.Q8_0
    assert cache_type(gguf.GGMLQuantizationType.IQ4_NL) is gguf.GGMLQuantizationType.IQ4_NL
    with pytest.raises(ValueError, match="unsupported cache type"):
        cache_type("q4_k")
    with pytest.raises(ValueError, match="unsupported cache type"):
        cache_type(gguf.GGMLQuantizationType.Q6_K)


def _gemma3(files: Any, n_layer: int = 12, window: int = 512) -> ModelFacts:
    def build(w: gguf.GGUFWriter) -> None:
        w.add_context_length(32768)
        w.add_embedding_length(640)
        w.add_block_count(n_layer)
        w.add_head_count(4)
        w.add_head_count_kv(1)
        w.add_key_length(256)
        w.add_value_length(256)
        w.add_sliding_window(window)

    return model_facts(read_header(files.write("g3.gguf", "gemma3", build)))


def test_swa_layers_sized_by_window(files: Any) -> None:
    f = _gemma3(files)
    per_layer_cell = 256 * 2 * 2  # K + V, one KV head of 256, f16
    est = kv_cache_estimate(f, 8192, 1, n_ubatch=512)
    assert est.cells == 8192
    assert est.swa_cells == 1024  # PAD(min(8192, 512 x 1 + 512), 256)
    assert est.total == (10 * 1024 + 2 * 8192) * per_layer_cell
    # unified with 4 sequences: the window is kept for each of them
    assert kv_cache_estimate(f, 8192, 4, n_ubatch=512).swa_cells == 2560
    # per-sequence streams: one window per stream
    split = kv_cache_estimate(f, 8192, 4, n_ubatch=512, unified=False)
    assert (split.cells, split.swa_cells, split.n_stream) == (2048, 1024, 4)
    # never more than the full cache, and --swa-full uses the full size
    assert kv_cache_estimate(f, 512, 1, n_ubatch=512).swa_cells == 512
    full = kv_cache_estimate(f, 8192, 1, swa_full=True)
    assert full.swa_cells == 8192
    assert full.total == 12 * 8192 * per_layer_cell
    assert kv_bytes_per_token(f) == 12 * per_layer_cell


def test_swa_head_sizes(files: Any) -> None:
    f = attrs.evolve(_gemma3(files, n_layer=6), key_length_swa=128, value_length_swa=64)
    est = kv_cache_estimate(f, 4096, 1, n_ubatch=512)
    assert est.k_bytes == (5 * 1024 * 128 + 4096 * 256) * 2
    assert est.v_bytes == (5 * 1024 * 64 + 4096 * 256) * 2
    # without flash attention V is transposed and padded to the widest layer
    no_fa = kv_cache_estimate(f, 4096, 1, n_ubatch=512, flash_attn=False)
    assert no_fa.v_bytes == (5 * 1024 + 4096) * 256 * 2


def test_mtp_layers_are_not_in_the_main_cache(files: Any) -> None:
    def extra(w: gguf.GGUFWriter) -> None:
        w.add_nextn_predict_layers(1)

    f = model_facts(read_header(files.llama(tensors=False, extra=extra)))
    assert f.n_layer == 3
    assert kv_bytes_per_token(f) == 3 * 256


def test_mla_has_no_v_cache(files: Any) -> None:
    def build(w: gguf.GGUFWriter) -> None:
        w.add_context_length(4096)
        w.add_embedding_length(2048)
        w.add_block_count(2)
        w.add_head_count(16)
        w.add_head_count_kv(1)
        w.add_key_length(576)  # kv_lora_rank 512 + rope 64
        w.add_value_length(512)
        w.add_uint32("deepseek2.attention.key_length_mla", 192)
        w.add_uint32("deepseek2.attention.value_length_mla", 128)

    f = model_facts(read_header(files.write("ds.gguf", "deepseek2", build)))
    assert f.is_mla
    est = kv_cache_estimate(f, 4096)
    assert est.v_bytes == 0
    assert est.k_bytes == 2 * 4096 * 576 * 2


def test_architectures_without_kv_cache(files: Any) -> None:
    def build(w: gguf.GGUFWriter) -> None:
        w.add_context_length(512)
        w.add_embedding_length(384)
        w.add_block_count(6)
        w.add_head_count(12)
        w.add_pooling_type(gguf.PoolingType.MEAN)

    f = model_facts(read_header(files.write("bert.gguf", "bert", build)))
    assert kv_cache_bytes(f, 512) == 0


def test_shared_kv_layers(files: Any) -> None:
    def build(w: gguf.GGUFWriter) -> None:
        w.add_context_length(4096)
        w.add_embedding_length(256)
        w.add_block_count(6)
        w.add_head_count(2)
        w.add_head_count_kv(1)
        w.add_sliding_window(512)
        w.add_sliding_window_pattern([True, True, False, True, True, False])
        w.add_uint32("gemma4.attention.shared_kv_layers", 2)

    f = model_facts(read_header(files.write("g4.gguf", "gemma4", build)))
    assert f.kv_layers_from_start == 4  # the last 2 layers reuse earlier caches
    est = kv_cache_estimate(f, 4096, 1, n_ubatch=512)
    # layers 0, 1, 3 are SWA (1024 cells), layer 2 is full (4096); 128-wide heads, f16
    assert est.total == (3 * 1024 + 4096) * 128 * 2 * 2

    # other architectures ignore the key
    def other(w: gguf.GGUFWriter) -> None:
        w.add_uint32("llama.attention.shared_kv_layers", 1)

    g = model_facts(read_header(files.llama(tensors=False, extra=other)))
    assert g.kv_layers_from_start is None
    assert kv_bytes_per_token(g) == 1024


def test_missing_context_length(files: Any) -> None:
    def build(w: gguf.GGUFWriter) -> None:
        w.add_block_count(1)

    f = model_facts(read_header(files.write("x.gguf", "llama", build)))
    with pytest.raises(ValueError, match="context_length"):
        kv_cache_bytes(f, 0)
    assert kv_cache_bytes(f, 256) == 0  # no heads: nothing to cache


def _gemma3_270m(files: Any) -> ModelFacts:
    """The metadata of Gemma 3 270M (the demo model) that sizes its KV cache."""

    def build(w: gguf.GGUFWriter) -> None:
        w.add_context_length(32768)
        w.add_embedding_length(640)
        w.add_block_count(18)
        w.add_head_count(4)
        w.add_head_count_kv(1)
        w.add_key_length(256)
        w.add_value_length(256)
        w.add_sliding_window(512)

    return model_facts(read_header(files.write("gemma3-270m.gguf", "gemma3", build)))


# Measured with the pinned llama-server (-lv 4) on the real gemma-3-270m Q4_K_M file:
# "llama_kv_cache: size = X MiB (N cells, 3 layers, ...)" for the non-SWA cache, then
# the same line for the SWA cache (15 layers).
@pytest.mark.parametrize(
    ("argv", "kwargs", "base_mib", "swa_mib"),
    [
        ("-c 4096 -np 1", {"n_ctx": 4096, "n_seq": 1, "unified": False}, 12.0, 15.0),
        ("-c 4096 (np auto = 4, kvu)", {"n_ctx": 4096, "n_seq": 4}, 12.0, 37.5),
        ("-c 4096 -np 4 -no-kvu", {"n_ctx": 4096, "n_seq": 4, "unified": False}, 12.0, 60.0),
        (
            "-c 0 -np 1 -ctk q8_0 -ctv q8_0",
            {"n_ctx": 0, "n_seq": 1, "unified": False, "type_k": "q8_0", "type_v": "q8_0"},
            51.0,
            7.97,
        ),
        ("-c 4096 -np 1 --swa-full", {"n_ctx": 4096, "unified": False, "swa_full": True}, 12, 60),
    ],
)
def test_matches_llama_server_on_gemma3_270m(
    files: Any, argv: str, kwargs: dict[str, Any], base_mib: float, swa_mib: float
) -> None:
    f = _gemma3_270m(files)
    assert sum(f.swa_layers or ()) == 15
    assert round(kv_cache_bytes(f, **kwargs) / MiB, 2) == base_mib + swa_mib, argv
