"""llama.cpp's own memory breakdown, as ``common_memory_breakdown_print`` logs it.

Rows (MiB)::

    | memory breakdown [MiB] | total   free    self   model   context   compute    unaccounted |
    |   - CUDA0 (RTX 4090)   | 24564 = 23000 + (1200 =  1000 +     100 +     100) +   364 |
    |   - Host               |                  285 =   235 +      27 +      23                |

It is logged at verbosity 4 (``-lv 4``): once or twice while ``--fit`` projects what
the model will take (before any weight is loaded: first at the initial parameters,
then at the smallest context fit may choose if those do not fit), and at exit.
A device row (it has total and free columns) is that device's; every other row
(``Host``, ``CPU_REPACK``, ...) is memory on the host.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import attrs

__all__ = [
    "BreakdownRow",
    "BufferLine",
    "device_name",
    "last_breakdown",
    "need_of_rows",
    "parse_breakdown_line",
    "parse_buffer_line",
]

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


_DEVICE = re.compile(r"^(?P<kind>[A-Za-z]+?)(?P<index>\d+)\b")


def device_name(row: BreakdownRow) -> str:
    """troupe's name of the device a row is about: "host", "cuda:0", "vulkan:1", ..."""
    if row.total is None:
        return "host"
    m = _DEVICE.match(row.name)
    if m is None:
        return row.name.split(" ", 1)[0].lower()
    return f"{m['kind'].lower()}:{m['index']}"


def need_of_rows(rows: list[BreakdownRow]) -> dict[str, int]:
    """Bytes per device: model + context + compute of every row, summed by device."""
    need: dict[str, int] = {}
    for row in rows:
        name = device_name(row)
        need[name] = need.get(name, 0) + row.self_bytes
    return need


def last_breakdown(lines: Iterable[str]) -> dict[str, int]:
    """Bytes per device of the last breakdown block in a log (the one printed at exit is
    what the child held once loaded)."""
    rows: list[BreakdownRow] = []
    in_block = False
    for line in lines:
        if "memory breakdown [MiB]" in line:
            rows, in_block = [], True
            continue
        row = parse_breakdown_line(line) if in_block else None
        if row is None:
            in_block = False
        else:
            rows.append(row)
    return need_of_rows(rows)


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
