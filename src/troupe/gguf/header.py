"""A fast, header-only GGUF reader.

`gguf.GGUFReader` maps the whole file and decodes every key and array up front
(seconds on a 150k-token vocabulary). `read_header` streams the header once and
skips what troupe does not need by its length: bulky arrays (tokenizer tokens,
merges, scores) keep only their element type and length as a `SkippedArray`,
while small arrays (per-layer ``head_count_kv``, SWA patterns) are decoded.

The layout (GGUF v2/v3, either byte order)::

    magic "GGUF" | u32 version | u64 tensor_count | u64 kv_count
    kv_count x (string key, u32 type, value)
    tensor_count x (string name, u32 n_dims, u64 dims[n_dims], u32 type, u64 offset)
    padding to `alignment` | tensor data

Every count and length is checked against the bytes the file can still hold
before it is used, so a corrupt or truncated file raises `GGUFError`. Keys and
tensor names must be UTF-8; string values are decoded leniently (bad bytes
become U+FFFD) so one odd chat template does not hide a model.
"""

from __future__ import annotations

import os
import stat
import struct
from collections.abc import Mapping

from troupe.gguf._source import GGUFError, Source
from troupe.gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from troupe.gguf.records import Field, GGUFHeader, Scalar, SkippedArray, TensorInfo, Value

__all__ = [
    "Field",
    "GGUFError",
    "GGUFHeader",
    "SkippedArray",
    "TensorInfo",
    "Value",
    "read_header",
]

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_KEY_BYTES = 1 << 16
MAX_NAME_BYTES = 1 << 12
MAX_STRING_BYTES = 64 << 20
MAX_NESTING = 8
# Arrays never decoded, whatever their length: troupe only needs how long they are.
BULK_ARRAYS = frozenset(
    {
        "tokenizer.ggml.tokens",
        "tokenizer.ggml.merges",
        "tokenizer.ggml.scores",
        "tokenizer.ggml.token_type",
        "tokenizer.ggml.precompiled_charsmap",
    }
)

_T = GGUFValueType
# struct code and size of each fixed-size value type
_SCALARS: dict[GGUFValueType, tuple[str, int]] = {
    _T.UINT8: ("B", 1), _T.INT8: ("b", 1), _T.UINT16: ("H", 2), _T.INT16: ("h", 2),
    _T.UINT32: ("I", 4), _T.INT32: ("i", 4), _T.FLOAT32: ("f", 4), _T.BOOL: ("?", 1),
    _T.UINT64: ("Q", 8), _T.INT64: ("q", 8), _T.FLOAT64: ("d", 8),
}  # fmt: skip
# smallest encoding of one element, to bound counts by the bytes left
_MIN_SIZE = {**{t: s for t, (_, s) in _SCALARS.items()}, _T.STRING: 8, _T.ARRAY: 12}


def read_header(
    path: str | os.PathLike[str],
    *,
    max_array_items: int = 1024,
    max_header_bytes: int = 1 << 30,
    check_data: bool = True,
) -> GGUFHeader:
    """Read the header of the GGUF file at `path`.

    Arrays longer than `max_array_items`, arrays of arrays and the `BULK_ARRAYS`
    become `SkippedArray`. `check_data` also checks that every tensor's data lies
    inside the file (a truncated download fails here rather than at load).
    """
    p = os.fspath(path)
    try:
        if not stat.S_ISREG(os.stat(p).st_mode):  # a FIFO would block open()
            raise GGUFError("not a regular file")
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            src = Source(f, size, max_header_bytes, p)
            return _Parser(src, max_array_items).parse(check_data)
    except GGUFError as e:
        raise GGUFError(f"{p}: {e}") from None
    except OSError as e:
        raise GGUFError(f"{p}: cannot read: {e.strerror or e}") from e


class _Parser:
    def __init__(self, src: Source, max_array_items: int) -> None:
        self.src = src
        self.max_items = max_array_items
        self.order = "<"

    def parse(self, check_data: bool) -> GGUFHeader:
        src = self.src
        if src.size < 4 or src.read(4) != GGUF_MAGIC:
            raise GGUFError("not a GGUF file (bad magic)")
        version = src.read_u32()
        if version & 0xFFFF == 0:  # written in the other byte order
            self.order = ">"
            src.set_order(">")
            version = int.from_bytes(version.to_bytes(4, "little"), "big")
        if version not in (2, 3):
            raise GGUFError(f"unsupported GGUF version {version} (2 and 3 are)")
        n_tensors, n_kv = src.read_u64(), src.read_u64()
        self._check_count(n_kv, 8 + 4 + 1, "key-value count")  # empty key, u8 value
        fields: dict[str, Field] = {}
        for i in range(n_kv):
            key = self._key(i)
            if key in fields:
                raise GGUFError(f"duplicate key {key!r}")
            try:
                fields[key] = self._field(src.read_u32(), key in BULK_ARRAYS)
            except GGUFError as e:
                raise GGUFError(f"key {key!r}: {e}") from None
        alignment = self._alignment(fields)
        self._check_count(n_tensors, 8 + 4 + 4 + 8, "tensor count")  # 0-d, empty name
        tensors = [self._tensor(i, alignment) for i in range(n_tensors)]
        if len({t.name for t in tensors}) != len(tensors):
            raise GGUFError("duplicate tensor name")
        data_offset = -(-src.tell() // alignment) * alignment
        if check_data:
            for t in tensors:
                if data_offset + t.offset + t.n_bytes > src.size:
                    raise GGUFError(
                        f"truncated: tensor {t.name!r} ends at "
                        f"{data_offset + t.offset + t.n_bytes} past the file end {src.size}"
                    )
        return GGUFHeader(
            path=src.path, version=version, byte_order=self.order, fields=fields,
            tensors=tuple(tensors), alignment=alignment, data_offset=data_offset,
            file_size=src.size,
        )  # fmt: skip

    def _check_count(self, n: int, min_size: int, what: str) -> None:
        if n * min_size > self.src.remaining():
            raise GGUFError(
                f"truncated or corrupt: {what} {n} is more than the "
                f"{self.src.remaining()} bytes left can hold"
            )

    def _key(self, i: int) -> str:
        try:
            return self.src.read_str_bytes(MAX_KEY_BYTES).decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError(f"key #{i} is not valid UTF-8") from None
        except GGUFError as e:
            raise GGUFError(f"key #{i}: {e}") from None

    def _type(self, raw: int) -> GGUFValueType:
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise GGUFError(f"unknown value type {raw}") from None

    def _field(self, raw_type: int, bulk: bool) -> Field:
        vtype = self._type(raw_type)
        if vtype is not _T.ARRAY:
            return Field(vtype, self._scalar(vtype))
        etype, n = self._type(self.src.read_u32()), self.src.read_u64()
        self._check_count(n, _MIN_SIZE[etype], "array length")
        if bulk or etype is _T.ARRAY or n > self.max_items:
            self._skip(etype, n, 0)
            return Field(vtype, SkippedArray(etype, n), etype)
        if etype is _T.STRING:
            return Field(vtype, tuple(self._scalar(etype) for _ in range(n)), etype)
        code, size = _SCALARS[etype]
        raw = self.src.read(n * size)
        return Field(vtype, struct.unpack(f"{self.order}{n}{code}", raw), etype)

    def _scalar(self, vtype: GGUFValueType) -> Scalar:
        if vtype is _T.STRING:
            return self.src.read_str_bytes(MAX_STRING_BYTES).decode("utf-8", "replace")
        code, size = _SCALARS[vtype]
        v: Scalar = struct.unpack(self.order + code, self.src.read(size))[0]
        return v

    def _skip(self, etype: GGUFValueType, n: int, depth: int) -> None:
        if etype is _T.STRING:
            self.src.skip_strings(n)
        elif etype is _T.ARRAY:
            if depth >= MAX_NESTING:
                raise GGUFError(f"arrays nested deeper than {MAX_NESTING}")
            for _ in range(n):
                sub, m = self._type(self.src.read_u32()), self.src.read_u64()
                self._check_count(m, _MIN_SIZE[sub], "array length")
                self._skip(sub, m, depth + 1)
        else:
            self.src.skip(n * _MIN_SIZE[etype])

    def _alignment(self, fields: Mapping[str, Field]) -> int:
        f = fields.get("general.alignment")
        if f is None:
            return DEFAULT_ALIGNMENT
        a = f.value
        if f.type is not _T.UINT32 or not isinstance(a, int) or a <= 0 or a & (a - 1):
            raise GGUFError(f"general.alignment must be a power-of-two uint32, got {a!r}")
        return a

    def _tensor(self, i: int, alignment: int) -> TensorInfo:
        src = self.src
        try:
            name = src.read_str_bytes(MAX_NAME_BYTES).decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFError(f"tensor #{i}: name is not valid UTF-8") from None
        except GGUFError as e:
            raise GGUFError(f"tensor #{i}: {e}") from None
        try:
            n_dims = src.read_u32()
            if n_dims > MAX_DIMS:
                raise GGUFError(f"{n_dims} dimensions (at most {MAX_DIMS})")
            dims = tuple(src.read_u64() for _ in range(n_dims))
            raw = src.read_u32()
            offset = src.read_u64()
            try:
                qtype = GGMLQuantizationType(raw)
                block, type_size = GGML_QUANT_SIZES[qtype]
            except (ValueError, KeyError):
                raise GGUFError(f"unknown tensor type {raw}") from None
            n_elements = 1
            for d in dims:
                n_elements *= d
            if n_elements >= 1 << 63:
                raise GGUFError(f"shape {dims} overflows")
            if dims and dims[0] % block:
                raise GGUFError(f"ne[0]={dims[0]} is not a multiple of block size {block}")
            if offset % alignment:
                raise GGUFError(f"data offset {offset} is not aligned to {alignment}")
        except GGUFError as e:
            raise GGUFError(f"tensor {name!r}: {e}") from None
        return TensorInfo(name, dims, qtype, offset, n_elements, n_elements * type_size // block)
