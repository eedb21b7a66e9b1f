"""The tiny GGUF writer: deterministic, distinct per name and seed, extra metadata honoured."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from troupe_rig import TinyModel, write_tiny_gguf, write_tiny_models


def _fields(path: Path) -> dict[str, object]:
    reader = gguf.GGUFReader(path)
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def test_same_spec_same_bytes_and_about_a_megabyte(tmp_path: Path) -> None:
    spec = TinyModel("tiny", seed=3)
    a = write_tiny_gguf(tmp_path / "a.gguf", spec)
    b = write_tiny_gguf(tmp_path / "b.gguf", spec)
    assert a.read_bytes() == b.read_bytes()
    assert 1_000_000 < a.stat().st_size < 2_000_000


def test_names_and_seeds_give_distinct_models(tmp_path: Path) -> None:
    paths = write_tiny_models(tmp_path, 3)
    assert [p.name for p in paths] == ["tiny-a.gguf", "tiny-b.gguf", "tiny-c.gguf"]
    names = [_fields(p)["general.name"] for p in paths]
    assert names == ["tiny-a", "tiny-b", "tiny-c"]
    reseeded = write_tiny_gguf(tmp_path / "x.gguf", TinyModel("tiny-a", seed=99))
    weights = [
        np.array(gguf.GGUFReader(p).tensors[0].data) for p in (*paths, reseeded)
    ]  # token_embd.weight
    for i in range(len(weights)):
        for j in range(i + 1, len(weights)):
            assert not np.array_equal(weights[i], weights[j]), (i, j)


def test_shape_vocab_types_and_extra_metadata(tmp_path: Path) -> None:
    spec = TinyModel(
        "swa",
        extra={"llama.attention.sliding_window": 128, "llama.pooling_type": 1},
        chat_template=None,
    )
    path = write_tiny_gguf(tmp_path, spec)  # a directory: <name>.gguf inside it
    assert path == tmp_path / "swa.gguf"
    fields = _fields(path)
    assert fields["llama.attention.sliding_window"] == 128
    assert fields["llama.pooling_type"] == 1
    assert "tokenizer.chat_template" not in fields
    assert fields["llama.block_count"] == 4
    assert fields["llama.rope.dimension_count"] == 32
    tokens = fields["tokenizer.ggml.tokens"]
    assert isinstance(tokens, list)
    assert (len(tokens), tokens[:3], tokens[3]) == (294, ["<unk>", "<s>", "</s>"], "<0x00>")
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert types["blk.0.attn_q.weight"] == "F16"
    assert types["blk.0.attn_norm.weight"] == "F32"
    assert len(types) == 2 + 4 * 9 + 1
