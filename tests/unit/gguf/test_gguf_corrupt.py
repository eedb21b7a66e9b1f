"""Truncated and corrupt files give a GGUFError with a reason, never a hang."""

from __future__ import annotations

import contextlib
import os
import struct
import tempfile
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from troupe.errors import TroupeError
from troupe.gguf import GGUFError, SkippedArray, read_header

VT = gguf.GGUFValueType


def gstr(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def kv(key: str | bytes, vtype: int, payload: bytes) -> bytes:
    return gstr(key) + struct.pack("<I", vtype) + payload


def tinfo(name: str, dims: tuple[int, ...], qtype: int = 0, offset: int = 0) -> bytes:
    out = gstr(name) + struct.pack("<I", len(dims))
    out += b"".join(struct.pack("<Q", d) for d in dims)
    return out + struct.pack("<IQ", qtype, offset)


def raw_gguf(
    kvs: list[bytes] = (),  # type: ignore[assignment]
    tensors: list[bytes] = (),  # type: ignore[assignment]
    *,
    version: int = 3,
    n_kv: int | None = None,
    n_tensors: int | None = None,
    data: bytes = b"",
) -> bytes:
    head = b"GGUF" + struct.pack("<IQQ", version, len(tensors) if n_tensors is None else n_tensors,
                                 len(kvs) if n_kv is None else n_kv)  # fmt: skip
    body = head + b"".join(kvs) + b"".join(tensors)
    return body + b"\0" * (-len(body) % 32) + data


@pytest.fixture
def put(tmp_path: Path) -> Any:
    def put(data: bytes, name: str = "f.gguf") -> Path:
        p = tmp_path / name
        p.write_bytes(data)
        return p

    return put


def expect(path: Path, match: str) -> GGUFError:
    with pytest.raises(GGUFError, match=match) as info:
        read_header(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, TroupeError)
    return info.value


def test_raw_builder_agrees_with_reader(put: Any) -> None:
    arr = struct.pack("<IQ", VT.UINT32, 0)  # an empty array: GGUFWriter cannot write one
    p = put(raw_gguf([kv("a", VT.UINT32, struct.pack("<I", 7)), kv("e", VT.ARRAY, arr)],
                     [tinfo("t", (4,))], data=b"\0" * 16))  # fmt: skip
    h = read_header(p)
    assert h.get("a") == 7
    assert h.get("e") == ()
    assert h.tensors[0].n_bytes == 16


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"", "bad magic"),
        (b"GGU", "bad magic"),
        (b"GGML" + b"\0" * 60, "bad magic"),
        (raw_gguf(version=1), "version 1"),
        (raw_gguf(version=4), "version 4"),
        (raw_gguf(n_kv=10**12), "key-value count"),
        (raw_gguf(n_tensors=10**12), "tensor count"),
        (raw_gguf([kv("k", VT.STRING, struct.pack("<Q", 2**62))]), "exceeds|truncated"),
        (raw_gguf([kv("k", 99, b"")]), "unknown value type 99"),
        (raw_gguf([kv(b"\xff\xfe", VT.UINT8, b"\1")]), "not valid UTF-8"),
        (raw_gguf([gstr("k" * 70000)]), "exceeds"),
        (raw_gguf([kv("k", VT.ARRAY, struct.pack("<IQ", VT.UINT64, 2**40))]), "array length"),
        (raw_gguf([kv("k", VT.ARRAY, struct.pack("<IQ", VT.STRING, 2**40))]), "array length"),
        (raw_gguf([kv("k", VT.ARRAY, struct.pack("<IQ", 77, 1))]), "unknown value type 77"),
        (raw_gguf([kv("k", VT.UINT8, b"\1")] * 2), "duplicate key"),
        (raw_gguf([kv("general.alignment", VT.UINT32, struct.pack("<I", 48))]), "power-of-two"),
        (raw_gguf([kv("general.alignment", VT.UINT64, struct.pack("<Q", 64))]), "power-of-two"),
        (raw_gguf([kv("general.alignment", VT.UINT32, struct.pack("<I", 0))]), "power-of-two"),
        (raw_gguf(tensors=[tinfo("t", (1, 1, 1, 1, 1))]), "5 dimensions"),
        (raw_gguf(tensors=[tinfo("t", (4,), qtype=4)]), "unknown tensor type 4"),
        (raw_gguf(tensors=[tinfo("t", (4,), offset=8)], data=b"\0" * 64), "not aligned"),
        (raw_gguf(tensors=[tinfo("t", (2**40, 2**40))]), "overflows"),
        (raw_gguf(tensors=[tinfo("t", (33,), qtype=8)]), "not a multiple of block size 32"),
        (
            raw_gguf(tensors=[tinfo("t", (4,)), tinfo("t", (4,), offset=32)], data=b"\0" * 64),
            "duplicate tensor",
        ),
        (raw_gguf(tensors=[tinfo("t", (1024,))], data=b"\0" * 100), "tensor 't' ends at"),
    ],
)
def test_corrupt_header(put: Any, data: bytes, match: str) -> None:
    expect(put(data), match)


def test_nested_arrays_bounded(put: Any) -> None:
    inner = struct.pack("<IQ", VT.ARRAY, 1)
    deep = struct.pack("<IQ", VT.ARRAY, 1) + inner * 20 + struct.pack("<IQ", VT.UINT8, 0)
    expect(put(raw_gguf([kv("k", VT.ARRAY, deep)])), "nested deeper")
    ok = struct.pack("<IQ", VT.ARRAY, 1) + struct.pack("<IQ", VT.UINT8, 2) + b"\1\2"
    assert read_header(put(raw_gguf([kv("k", VT.ARRAY, ok)]), "ok.gguf")).get("k") == (
        SkippedArray(VT.ARRAY, 1)
    )


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(GGUFError, match="cannot read"):
        read_header(tmp_path / "nope.gguf")
    with pytest.raises(GGUFError, match="not a regular file"):
        read_header(tmp_path)
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    with pytest.raises(GGUFError, match="not a regular file"):
        read_header(fifo)  # would block in open() if it were opened


def _small_file() -> bytes:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "s.gguf"
        w = gguf.GGUFWriter(p, "llama")
        w.add_block_count(2)
        w.add_head_count_kv([2, 1])
        w.add_string("s", "text")
        w.add_array("a", ["x", "yz"])
        w.add_token_list(["a", "b", "c"])
        w.add_tensor("t", np.zeros((2, 32), np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return p.read_bytes()


SMALL = _small_file()


def _assert_truncations_fail(path: Path, cuts: range) -> None:
    data = path.read_bytes()
    h = read_header(path)
    cut_path = path.with_name("cut.gguf")
    for cut in cuts:
        if cut >= h.data_offset:
            break
        cut_path.write_bytes(data[:cut])
        with pytest.raises(GGUFError, match=r"truncated|bad magic"):
            read_header(cut_path)
    # cut inside the tensor data: the header is fine, the data is not
    cut_path.write_bytes(data[: h.data_offset + 10])
    with pytest.raises(GGUFError, match="truncated: tensor"):
        read_header(cut_path)
    assert len(read_header(cut_path, check_data=False).tensors) == len(h.tensors)


def test_every_truncation_fails_cleanly(tmp_path: Path) -> None:
    path = tmp_path / "small.gguf"
    path.write_bytes(SMALL)
    _assert_truncations_fail(path, range(len(SMALL)))


def test_truncations_of_llama_like_file(files: Any) -> None:
    _assert_truncations_fail(files.llama(n_layer=2), range(0, 1 << 20, 37))


def test_truncated_big_vocabulary(big_vocab_file: Path, tmp_path: Path) -> None:
    data = big_vocab_file.read_bytes()
    for cut in (100, len(data) // 3, len(data) // 2, len(data) - 2000):
        p = tmp_path / f"cut{cut}.gguf"
        p.write_bytes(data[:cut])
        with pytest.raises(GGUFError, match="truncated"):
            read_header(p)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(SMALL) - 1), st.integers(0, 255)), max_size=4))
def test_random_corruption_reads_or_raises_gguf_error(flips: list[tuple[int, int]]) -> None:
    data = bytearray(SMALL)
    for at, byte in flips:
        data[at] = byte
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "c.gguf"
        p.write_bytes(bytes(data))
        with contextlib.suppress(GGUFError):
            read_header(p)
