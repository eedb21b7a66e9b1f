"""The header reader against gguf.GGUFReader, and its failure modes."""

from __future__ import annotations

import math
import struct
import tempfile
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from troupe.gguf import GGUFError, GGUFHeader, SkippedArray, _source, read_header
from troupe.gguf.constants import GGUFValueType

VT = GGUFValueType  # troupe's copy, equal to gguf's (test_gguf_constants.py)
PSEUDO_FIELDS = {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}


def same_value(mine: Any, theirs: Any) -> bool:
    if isinstance(mine, SkippedArray):
        return isinstance(theirs, list) and mine.length == len(theirs)
    if isinstance(mine, tuple):
        return len(mine) == len(theirs) and all(map(same_value, mine, theirs))
    if isinstance(mine, float):
        return (math.isnan(mine) and math.isnan(theirs)) or mine == theirs
    return bool(mine == theirs) and type(mine) is type(theirs)


def assert_matches_gguf_reader(header: GGUFHeader, path: Path) -> None:
    ref = gguf.GGUFReader(path)
    ref_fields = {k: f for k, f in ref.fields.items() if k not in PSEUDO_FIELDS}
    assert list(header.fields) == list(ref_fields)
    for key, f in ref_fields.items():
        mine = header.fields[key]
        assert mine.type == f.types[0], key
        if mine.type is VT.ARRAY:
            if len(f.types) > 1:
                assert mine.element_type == f.types[1], key
            else:  # GGUFReader keeps no element type for an empty array
                assert header.array_length(key) == 0, key
        if mine.element_type is VT.ARRAY:  # GGUFReader flattens nested arrays
            continue
        assert same_value(mine.value, f.contents()), (key, mine.value)
    assert header.data_offset == ref.data_offset
    assert header.alignment == ref.alignment
    assert len(header.tensors) == len(ref.tensors)
    for t, r in zip(header.tensors, ref.tensors, strict=True):
        assert t.name == r.name
        assert t.dims == tuple(int(d) for d in r.shape)
        assert t.type == r.tensor_type
        assert t.n_elements == r.n_elements
        assert t.n_bytes == r.n_bytes
        assert header.data_offset + t.offset == r.data_offset


def test_llama_like_header_matches_gguf_reader(files: Any) -> None:
    path = files.llama(n_head_kv=[2, 2, 1, 1])
    h = read_header(path)
    assert h.version == 3
    assert h.byte_order == "<"
    assert h.get("llama.attention.head_count_kv") == (2, 2, 1, 1)
    assert h.fields["llama.attention.head_count_kv"].element_type is VT.INT32
    # tokenizer arrays are never decoded, whatever their size
    assert h.get("tokenizer.ggml.tokens") == SkippedArray(VT.STRING, 294)
    assert h.get("tokenizer.ggml.scores") == SkippedArray(VT.FLOAT32, 294)
    assert h.array_length("tokenizer.ggml.token_type") == 294
    assert h.get_int("llama.context_length") == 512
    assert h.get_str("general.architecture") == "llama"
    assert h.get_bool("tokenizer.ggml.add_bos_token") is True
    assert h.get("missing", "default") == "default"
    assert_matches_gguf_reader(h, path)


def test_tensor_bytes_per_type(files: Any) -> None:
    h = read_header(files.llama())
    ref = gguf.GGUFReader(files.root / "tiny-llama.gguf")
    by_type: dict[str, int] = {}
    for t in ref.tensors:
        by_type[t.tensor_type.name] = by_type.get(t.tensor_type.name, 0) + int(t.n_bytes)
    assert h.bytes_by_type() == by_type
    assert set(by_type) == {"F16", "F32"}
    assert h.tensor_bytes == sum(by_type.values())
    assert h.n_elements == sum(int(t.n_elements) for t in ref.tensors)


def test_quantized_tensor_sizes(files: Any) -> None:
    q8_block, q8_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType.Q8_0]

    def build(w: gguf.GGUFWriter) -> None:
        raw = np.zeros((4, 64 // q8_block * q8_size), np.uint8)  # 4 rows of 64 Q8_0 values
        w.add_tensor("q", raw, raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    path = files.write("q.gguf", "llama", build)
    (t,) = read_header(path).tensors
    assert t.dims == (64, 4)
    assert t.n_elements == 256
    assert t.n_bytes == 4 * 2 * q8_size
    assert_matches_gguf_reader(read_header(path), path)


def test_custom_alignment(files: Any) -> None:
    def build(w: gguf.GGUFWriter) -> None:
        w.add_custom_alignment(64)
        w.add_tensor("a", np.zeros((3,), np.float32))
        w.add_tensor("b", np.zeros((5,), np.float32))

    path = files.write("aligned.gguf", "llama", build)
    h = read_header(path)
    assert h.alignment == 64
    assert h.data_offset % 64 == 0
    assert [t.offset for t in h.tensors] == [0, 64]
    assert_matches_gguf_reader(h, path)


def test_big_endian_file(files: Any) -> None:
    path = files.write("be.gguf", "llama", llama_like_small(), endianess=gguf.GGUFEndian.BIG)
    h = read_header(path)
    assert h.byte_order == ">"
    assert h.get("llama.attention.head_count_kv") == (2, 1)
    assert_matches_gguf_reader(h, path)


def llama_like_small() -> Any:
    def build(w: gguf.GGUFWriter) -> None:
        w.add_block_count(2)
        w.add_head_count_kv([2, 1])
        w.add_float64("x.f64", -1.5)
        w.add_string("x.s", "héllo")
        w.add_tensor("t", np.arange(6, dtype=np.float32).reshape(2, 3))

    return build


def test_version_2_reads_like_version_3(files: Any) -> None:
    path = files.write("v2.gguf", "llama", llama_like_small())
    data = bytearray(path.read_bytes())
    data[4:8] = struct.pack("<I", 2)
    path.write_bytes(bytes(data))
    h = read_header(path)
    assert h.version == 2
    assert h.get("llama.attention.head_count_kv") == (2, 1)


def test_small_arrays_decoded_long_arrays_skipped(files: Any) -> None:
    def build(w: gguf.GGUFWriter) -> None:
        w.add_array("x.small", list(range(10)))
        w.add_array("x.long", list(range(2000)))
        w.add_array("x.strs", ["a", "bc"])
        w.add_array("x.nested", [[1, 2], [3]])

    path = files.write("arrays.gguf", "llama", build)
    h = read_header(path)
    assert h.get("x.small") == tuple(range(10))
    assert h.get("x.long") == SkippedArray(VT.INT32, 2000)
    assert h.get("x.strs") == ("a", "bc")
    assert h.get("x.nested") == SkippedArray(VT.ARRAY, 2)
    assert h.array_length("x.long") == 2000
    assert read_header(path, max_array_items=5).get("x.small") == SkippedArray(VT.INT32, 10)
    assert_matches_gguf_reader(h, path)


def test_big_vocabulary_is_skipped_not_decoded(big_vocab_file: Path) -> None:
    h = read_header(big_vocab_file)
    assert h.get("tokenizer.ggml.tokens") == SkippedArray(VT.STRING, 151_936)
    assert h.get("tokenizer.ggml.merges") == SkippedArray(VT.STRING, 150_000)
    assert h.get("tokenizer.ggml.token_type") == SkippedArray(VT.INT32, 151_936)
    assert h.get_int("qwen2.context_length") == 32768
    assert [t.name for t in h.tensors] == ["token_embd.weight"]
    # the strings' bytes are never looked at: invalid UTF-8 inside them does not matter
    data = bytearray(big_vocab_file.read_bytes())
    at = data.index(b"t12345")
    data[at : at + 6] = b"\xff\xfe\xff\xfe\xff\xfe"
    corrupt = big_vocab_file.with_name("corrupt-vocab.gguf")
    corrupt.write_bytes(bytes(data))
    assert read_header(corrupt).get("tokenizer.ggml.tokens") == SkippedArray(VT.STRING, 151_936)
    # ...while a header limit smaller than the vocabulary is enforced
    with pytest.raises(GGUFError, match="limit"):
        read_header(big_vocab_file, max_header_bytes=1 << 20)


# --- Hypothesis: random small KV sets read the same as GGUFReader -----------------

_INT_RANGES = {
    VT.UINT8: (0, 2**8 - 1), VT.INT8: (-(2**7), 2**7 - 1),
    VT.UINT16: (0, 2**16 - 1), VT.INT16: (-(2**15), 2**15 - 1),
    VT.UINT32: (0, 2**32 - 1), VT.INT32: (-(2**31), 2**31 - 1),
    VT.UINT64: (0, 2**64 - 1), VT.INT64: (-(2**63), 2**63 - 1),
}  # fmt: skip
_ADD = {
    VT.UINT8: "add_uint8", VT.INT8: "add_int8", VT.UINT16: "add_uint16",
    VT.INT16: "add_int16", VT.UINT32: "add_uint32", VT.INT32: "add_int32",
    VT.UINT64: "add_uint64", VT.INT64: "add_int64", VT.FLOAT32: "add_float32",
    VT.FLOAT64: "add_float64", VT.BOOL: "add_bool", VT.STRING: "add_string",
}  # fmt: skip


def _scalar(vtype: VT) -> st.SearchStrategy[Any]:
    if vtype in _INT_RANGES:
        lo, hi = _INT_RANGES[vtype]
        return st.integers(lo, hi)
    if vtype is VT.FLOAT32:
        return st.floats(width=32, allow_nan=False)
    if vtype is VT.FLOAT64:
        return st.floats(allow_nan=False)
    if vtype is VT.BOOL:
        return st.booleans()
    return st.text(max_size=40)


_kv_entry = st.sampled_from(sorted(_ADD)).flatmap(
    lambda t: st.tuples(st.just(t), _scalar(t), st.booleans())
)
_key = st.text(st.characters(codec="utf-8"), min_size=1, max_size=30).filter(
    lambda k: k not in {"general.alignment", "general.architecture"}
)


def _put(w: gguf.GGUFWriter, key: str, vtype: VT, value: Any, as_array: bool) -> None:
    if not as_array:
        getattr(w, _ADD[vtype])(key, value)
        return
    if vtype is VT.BOOL:
        w.add_array(key, [value, not value])
    elif vtype is VT.STRING:
        w.add_array(key, [value, value + "x"])
    elif vtype in (VT.FLOAT32, VT.FLOAT64):
        w.add_key_value(key, [value, 0.5], VT.ARRAY, sub_type=vtype)
    else:
        w.add_key_value(key, [value, _INT_RANGES[vtype][0]], VT.ARRAY, sub_type=vtype)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(_key, _kv_entry, max_size=8), st.integers(0, 3))
def test_random_kv_sets_match_gguf_reader(kvs: dict[str, Any], n_tensors: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "random.gguf"
        w = gguf.GGUFWriter(path, "rand")
        for key, (vtype, value, as_array) in kvs.items():
            _put(w, key, vtype, value, as_array)
        for i in range(n_tensors):
            w.add_tensor(f"t{i}", np.zeros((i + 1, 3), np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        assert_matches_gguf_reader(read_header(path), path)


@pytest.mark.parametrize("chunk", [8, 13, 64, 1000])
def test_tiny_read_chunks_give_the_same_header(
    files: Any, monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    """Every value, string and skipped array crossing a buffer boundary."""
    path = files.llama(n_head_kv=[2, 2, 1, 1])
    expected = read_header(path)
    monkeypatch.setattr(_source, "_CHUNK", chunk)
    h = read_header(path)
    assert h.fields == expected.fields
    assert h.tensors == expected.tensors
    assert h.data_offset == expected.data_offset
    assert_matches_gguf_reader(h, path)
