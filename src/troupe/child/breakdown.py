"""llama.cpp's own memory breakdown, as ``common_memory_breakdown_print`` logs it.

Rows (MiB)::

    | memory breakdown [MiB] | total   free    self   model   context   compute    unaccounted |
    |   - CUDA0 (RTX 4090)   | 24564 = 23000 + (1200 =  1000 +     100 +     100) +   364 |
    |   - Host               |                  285 =   235 +      27 +      23                |

It is logged at verbosity 4 (``-lv 4``), when fit measures a model and at exit.
"""

from __future__ import annotations

import re

import attrs

__all__ = ["BreakdownRow", "BufferLine", "parse_breakdown_line", "parse_buffer_line"]

_GPU = re.compile(
    r"\|\s*-\s*(?P<name>.+?)\s*\|\s*(?P<total>\d+)\s*=\s*(?P<free>\d+)\s*\+\s*\(\s*(?P<self>\d+)\s*=\s*"
    r"(?P<model>\d+)\s*\+\s*(?P<context>\d+)\s*\+\s*(?P<compute>\d+)\s*\)\s*\+\s*(?P<unacc>-?\d+)\s*\|"
)
_OTHER = re.compile(
    r"\|\s*-\s*(?P<name>.+?)\s*\|\s*(?P<self>\d+)\s*=\s*(?P<model>\d+)\s*\+\s*(?P<context>\d+)\s*\+\s*"
    r"(?P<compute>\d+)\s*\|"
)
MIB = 1 << 20


@attrs.frozen
class BreakdownRow:
    name: str  # "Host", "CUDA0 (RTX 4090)", ...
    model: int  # bytes
    context: int
    compute: int
    total: int | None = None  # device rows only
    free: int | None = None

    @property
    def self_bytes(self) -> int:
        return self.model + self.context + self.compute


def parse_breakdown_line(line: str) -> BreakdownRow | None:
    if "memory_breakdown" not in line and "|" not in line:
        return None
    m = _GPU.search(line)
    if m is not None:
        return BreakdownRow(
            m["name"],
            int(m["model"]) * MIB,
            int(m["context"]) * MIB,
            int(m["compute"]) * MIB,
            int(m["total"]) * MIB,
            int(m["free"]) * MIB,
        )
    m = _OTHER.search(line)
    if m is not None:
        return BreakdownRow(
            m["name"], int(m["model"]) * MIB, int(m["context"]) * MIB, int(m["compute"]) * MIB
        )
    return None


_BUFFER = re.compile(
    r"(?P<dev>[A-Za-z0-9_]+)\s+(?P<kind>model|KV|compute|output)\s+buffer size"
    r"\s*=\s*(?P<mib>[0-9.]+)\s*MiB"
)
_KIND = {"model": "model", "KV": "context", "compute": "compute", "output": "output"}


@attrs.frozen
class BufferLine:
    device: str  # "CPU", "CPU_Mapped", "CUDA0", ...
    kind: str  # "model", "context", "compute", "output"
    bytes: int


def parse_buffer_line(line: str) -> BufferLine | None:
    """``load_tensors: CPU_Mapped model buffer size = 1.27 MiB`` and its KV, compute and
    output siblings (logged at verbosity 4, to 0.01 MiB)."""
    m = _BUFFER.search(line)
    if m is None:
        return None
    return BufferLine(m["dev"], _KIND[m["kind"]], int(float(m["mib"]) * MIB))
