"""Reading the tokens a slot file holds (the engine's ``llama_state_seq_save_file``).

The pinned engine writes ``ggsq`` (u32 magic), a u32 version, a u32 count and that many
i32 values: the server's token list, ``[-1, 1, n, t_0 .. t_n-1, 0]`` (its serialised
``server_tokens``), or the plain tokens of older engines. Then the KV cells.
"""

from __future__ import annotations

import struct
from pathlib import Path

__all__ = ["SLOT_MAGIC", "read_tokens"]

SLOT_MAGIC = 0x67677371  # "ggsq"
_MAX_TOKENS = 1 << 24


def read_tokens(path: Path) -> list[int] | None:
    """The prompt tokens cached in the slot file at ``path``, or None if it is not one."""
    try:
        with path.open("rb") as f:
            head = f.read(12)
            if len(head) < 12:
                return None
            magic, _version, count = struct.unpack("<III", head)
            if magic != SLOT_MAGIC or count > _MAX_TOKENS:
                return None
            raw = f.read(4 * count)
    except OSError:
        return None
    if len(raw) < 4 * count:
        return None
    values = list(struct.unpack(f"<{count}i", raw))
    if len(values) >= 3 and values[0] == -1 and 0 <= values[2] <= len(values) - 3:
        return values[3 : 3 + values[2]]
    if any(v < 0 for v in values):
        return None
    return values
