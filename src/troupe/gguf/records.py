"""The records a GGUF header reads into: fields, tensor infos, the header itself."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from troupe.gguf.constants import GGMLQuantizationType, GGUFValueType

__all__ = ["Field", "GGUFHeader", "Scalar", "SkippedArray", "TensorInfo", "Value"]


@attrs.frozen
class SkippedArray:
    """An array the reader did not decode: only its element type and length."""

    element_type: GGUFValueType
    length: int


Scalar = int | float | bool | str
Value = Scalar | tuple[Scalar, ...] | SkippedArray


@attrs.frozen
class Field:
    """One metadata key-value. `element_type` is set for arrays."""

    type: GGUFValueType
    value: Value
    element_type: GGUFValueType | None = None


@attrs.frozen
class TensorInfo:
    """One tensor-info entry. `dims` are in ggml order (``ne[0]`` first)."""

    name: str
    dims: tuple[int, ...]
    type: GGMLQuantizationType
    offset: int  # relative to the data section
    n_elements: int
    n_bytes: int


@attrs.frozen(eq=False)
class GGUFHeader:
    """Everything before the tensor data."""

    path: str
    version: int
    byte_order: str  # "<" little-endian, ">" big-endian
    fields: Mapping[str, Field]
    tensors: tuple[TensorInfo, ...]
    alignment: int
    data_offset: int  # absolute offset of the tensor data section
    file_size: int

    def get(self, key: str, default: Any = None) -> Any:
        """The value of `key` (a `Value`), or `default` if absent."""
        f = self.fields.get(key)
        return default if f is None else f.value

    def get_int(self, key: str) -> int | None:
        v = self.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    def get_str(self, key: str) -> str | None:
        v = self.get(key)
        return v if isinstance(v, str) else None

    def get_bool(self, key: str) -> bool | None:
        v = self.get(key)
        return v if isinstance(v, bool) else None

    def array_length(self, key: str) -> int | None:
        v = self.get(key)
        if isinstance(v, SkippedArray):
            return v.length
        return len(v) if isinstance(v, tuple) else None

    @property
    def tensor_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)

    @property
    def n_elements(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    def bytes_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tensors:
            out[t.type.name] = out.get(t.type.name, 0) + t.n_bytes
        return out
