"""troupe's copy of the GGUF constants equals the installed ``gguf`` package's, table
for table (troupe reads headers without importing ``gguf``, which imports numpy)."""

from __future__ import annotations

import subprocess
import sys
from enum import IntEnum

import gguf
import pytest

from troupe.gguf import constants


@pytest.mark.parametrize("name", ["GGUFValueType", "GGMLQuantizationType", "LlamaFileType"])
def test_each_enum_equals_gguf(name: str) -> None:
    ours: type[IntEnum] = getattr(constants, name)
    theirs: type[IntEnum] = getattr(gguf, name)
    assert [(m.name, m.value) for m in ours] == [(m.name, m.value) for m in theirs]


def test_the_quant_sizes_equal_gguf() -> None:
    ours = {t.name: size for t, size in constants.GGML_QUANT_SIZES.items()}
    theirs = {t.name: size for t, size in gguf.GGML_QUANT_SIZES.items()}
    assert ours == theirs


def test_reading_a_header_imports_neither_gguf_nor_numpy() -> None:
    code = (
        "import sys, troupe.gguf, troupe.catalog.facts\n"
        "print(sorted(m for m in ('gguf', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
