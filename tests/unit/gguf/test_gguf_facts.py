"""Model facts and capabilities from real GGUF files."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from troupe.gguf import (
    GGUFError,
    input_modalities,
    mmproj_modalities,
    model_facts,
    read_header,
    read_mmproj_modalities,
    read_model_facts,
    shard_paths,
)
from troupe.gguf.capabilities import CLIP_REJECTION

K = gguf.Keys


def test_llama_facts(files: Any) -> None:
    path = files.llama(n_head_kv=[2, 2, 1, 1])
    f = read_model_facts(path)
    ref = gguf.GGUFReader(path)
    assert f.architecture == "llama"
    assert f.name == "tiny-llama"
    assert f.context_length == 512
    assert f.embedding_length == 128
    assert f.block_count == 4
    assert f.n_layer == 4
    assert f.head_count == 4
    assert f.head_count_kv == (2, 2, 1, 1)
    assert f.per_layer(f.head_count_kv) == (2, 2, 1, 1)
    assert f.per_layer(f.head_count) == (4, 4, 4, 4)
    assert f.key_length is None
    assert f.value_length is None
    assert f.sliding_window is None
    assert f.swa_layers is None
    assert f.swa_window == 0
    assert f.file_type == gguf.LlamaFileType.MOSTLY_F16
    assert f.file_type_name == "F16"
    assert f.vocab_size == 294
    assert f.has_chat_template
    assert f.chat_template_mentions_tools
    assert f.pooling_type is None
    assert not f.is_embedding
    assert f.mtp_layers == 0
    assert (f.split_count, f.split_no, f.shards_read) == (1, 0, 1)
    assert f.parameter_count == sum(int(t.n_elements) for t in ref.tensors)
    assert f.tensor_bytes == sum(int(t.n_bytes) for t in ref.tensors)
    assert set(f.tensor_bytes_by_type) == {"F16", "F32"}
    assert f.output_modalities == ("text",)
    assert f.rejection is None
    assert not f.is_mla


def test_chat_template_variants(files: Any) -> None:
    def tpl(template: str | None) -> Any:
        def extra(w: gguf.GGUFWriter) -> None:
            w.add_block_count(1)

        def build(w: gguf.GGUFWriter) -> None:
            extra(w)
            if template is not None:
                w.add_chat_template(template)

        return build

    plain = model_facts(read_header(files.write("a.gguf", "llama", tpl("{{ messages }}"))))
    assert plain.has_chat_template
    assert not plain.chat_template_mentions_tools
    none = model_facts(read_header(files.write("b.gguf", "llama", tpl(None))))
    assert not none.has_chat_template
    assert not none.chat_template_mentions_tools
    assert none.vocab_size is None


def test_explicit_head_sizes_sliding_window_and_vocab_size(files: Any) -> None:
    def extra(w: gguf.GGUFWriter) -> None:
        w.add_key_length(48)
        w.add_value_length(40)
        w.add_sliding_window(1024)
        w.add_vocab_size(300)
        w.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_K_M)

    f = read_model_facts(files.llama(extra=extra, tensors=False))
    assert (f.key_length, f.value_length) == (48, 40)
    assert f.sliding_window == 1024
    assert f.swa_layers is None  # llama does not use the key (llama.cpp ignores it)
    assert f.vocab_size == 300
    assert f.file_type_name == "Q4_K_M"


def _gemma3(n_layer: int, window: int | None, pattern: Any = None) -> Any:
    def build(w: gguf.GGUFWriter) -> None:
        w.add_context_length(8192)
        w.add_embedding_length(640)
        w.add_block_count(n_layer)
        w.add_head_count(4)
        w.add_head_count_kv(1)
        w.add_key_length(256)
        w.add_value_length(256)
        if window is not None:
            w.add_sliding_window(window)
        if pattern is not None:
            w.add_sliding_window_pattern(pattern)

    return build


def test_swa_pattern_from_architecture_default(files: Any) -> None:
    f = model_facts(read_header(files.write("g.gguf", "gemma3", _gemma3(12, 512))))
    assert f.sliding_window == 512
    assert f.swa_window == 512
    # gemma3: period 6, the last layer of each period is full attention
    assert f.swa_layers == tuple(il % 6 < 5 for il in range(12))
    no_window = model_facts(read_header(files.write("h.gguf", "gemma3", _gemma3(12, None))))
    assert no_window.swa_layers is None


def test_swa_pattern_from_file(files: Any) -> None:
    flags = [True, False, True, True]
    f = model_facts(read_header(files.write("p.gguf", "gemma3", _gemma3(4, 128, flags))))
    assert f.swa_layers == tuple(flags)
    period = model_facts(read_header(files.write("q.gguf", "gemma3", _gemma3(6, 128, 3))))
    assert period.swa_layers == (True, True, False, True, True, False)
    # an unknown architecture with an explicit per-layer pattern
    other = model_facts(read_header(files.write("r.gguf", "newarch", _gemma3(4, 64, flags))))
    assert other.swa_layers == tuple(flags)
    assert other.swa_window == 64


def test_gemma2_default_window(files: Any) -> None:
    f = model_facts(read_header(files.write("g2.gguf", "gemma2", _gemma3(4, None))))
    assert f.swa_window == 4096
    assert f.swa_layers == (True, False, True, False)


def test_mtp_layers(files: Any) -> None:
    def own(w: gguf.GGUFWriter) -> None:
        w.add_block_count(5)
        w.add_nextn_predict_layers(1)

    f = model_facts(read_header(files.write("mtp.gguf", "glm4moe", own)))
    assert f.mtp_layers == 1
    assert f.n_layer == 4

    def foreign(w: gguf.GGUFWriter) -> None:
        w.add_uint32("other.nextn_predict_layers", 2)

    g = model_facts(read_header(files.write("mtp2.gguf", "qwen3", foreign)))
    assert g.mtp_layers == 2

    def float_value(w: gguf.GGUFWriter) -> None:
        w.add_float32("qwen3.nextn_predict_layers", 1.7)

    assert model_facts(read_header(files.write("m3.gguf", "qwen3", float_value))).mtp_layers == 1


@pytest.mark.parametrize(
    ("arch", "pooling", "embedding"),
    [
        ("bert", gguf.PoolingType.MEAN, True),
        ("nomic-bert", None, True),
        ("gemma-embedding", None, True),
        ("my-embed-model", None, True),
        ("qwen3", gguf.PoolingType.LAST, True),
        ("qwen3", gguf.PoolingType.NONE, False),
        ("llama", None, False),
    ],
)
def test_embedding_detection(files: Any, arch: str, pooling: Any, embedding: bool) -> None:
    def build(w: gguf.GGUFWriter) -> None:
        w.add_block_count(2)
        if pooling is not None:
            w.add_pooling_type(pooling)

    f = model_facts(read_header(files.write(f"{arch}.gguf", arch, build)))
    assert f.is_embedding is embedding
    assert f.pooling_type == (None if pooling is None else int(pooling))


@pytest.mark.parametrize(
    ("vision", "audio", "expected"),
    [
        (None, None, ("image",)),
        (True, None, ("image",)),
        (None, True, ("audio",)),
        (True, True, ("image", "audio")),
        (False, True, ("audio",)),
        (False, False, ()),
    ],
)
def test_mmproj_modalities(files: Any, vision: Any, audio: Any, expected: Any) -> None:
    path = files.mmproj(vision, audio)
    assert read_mmproj_modalities(path) == expected
    assert input_modalities(read_header(path)) == ("text", *expected)


def test_mmproj_string_flags(files: Any) -> None:
    def build(w: gguf.GGUFWriter) -> None:
        w.add_string("clip.has_vision_encoder", "TRUE")
        w.add_string("clip.has_audio_encoder", "no")

    path = files.write("s.gguf", "clip", build)
    assert mmproj_modalities(read_header(path)) == ("image",)


def test_no_mmproj_is_text_only() -> None:
    assert input_modalities(None) == ("text",)


def test_non_clip_mmproj_is_an_error(files: Any) -> None:
    with pytest.raises(GGUFError, match="not an mmproj"):
        read_mmproj_modalities(files.llama(tensors=False))


def test_clip_main_model_is_rejected(files: Any) -> None:
    f = read_model_facts(files.mmproj(True, False))
    assert f.architecture == "clip"
    assert f.kind == "mmproj"
    assert f.rejection == CLIP_REJECTION
    assert "mmproj" in CLIP_REJECTION


def test_missing_architecture_is_an_error(tmp_path: Path) -> None:
    p = tmp_path / "noarch.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 0))
    with pytest.raises(GGUFError, match=r"no general\.architecture"):
        read_model_facts(p)


@pytest.mark.parametrize(
    ("decision", "modalities"),
    [
        ("openjev", ("decisions",)),
        ("clef", ("decisions",)),
        ("bogus", ("text",)),
        (None, ("text",)),
    ],
)
def test_output_modalities(files: Any, decision: str | None, modalities: Any) -> None:
    def build(w: gguf.GGUFWriter) -> None:
        if decision is not None:
            w.add_string("qwen3.decision.type", decision)

    f = model_facts(read_header(files.write("d.gguf", "qwen3", build)))
    assert f.decision_type == decision
    assert f.output_modalities == modalities


def _split_build(w: gguf.GGUFWriter) -> None:
    w.add_block_count(3)
    w.add_context_length(256)
    for i in range(3):
        w.add_tensor(f"blk.{i}.w", np.zeros((4, 32 * (i + 1)), np.float16))


def test_split_model(files: Any) -> None:
    files.write("model.gguf", "llama", _split_build, split_max_tensors=1)
    first = files.root / "model-00001-of-00003.gguf"
    assert shard_paths(first, 3) == [
        str(files.root / f"model-0000{i}-of-00003.gguf") for i in (1, 2, 3)
    ]
    f = read_model_facts(first)
    assert (f.split_count, f.split_no, f.shards_read) == (3, 0, 3)
    assert f.parameter_count == 4 * 32 * (1 + 2 + 3)
    assert f.tensor_bytes == 2 * 4 * 32 * (1 + 2 + 3)
    assert f.context_length == 256
    from_second = read_model_facts(files.root / "model-00002-of-00003.gguf")
    assert from_second == f
    (files.root / "model-00003-of-00003.gguf").unlink()
    partial = read_model_facts(first)
    assert partial.shards_read == 2
    assert partial.parameter_count is None  # never a silent undercount
    assert partial.tensor_bytes == 2 * 4 * 32 * (1 + 2)


def test_shard_paths_of_unsplit_name() -> None:
    assert shard_paths("/m/model.gguf", 3) == ["/m/model.gguf"]
    assert shard_paths("/m/model-00001-of-00002.gguf", 1) == ["/m/model-00001-of-00002.gguf"]
