"""Which children may share KV entries: the model's files and every argument that can
change what a slot's KV cells mean (context, cache types, rope, SWA, draft, mmproj...).

Arguments are kept unless known not to touch the KV layout (a deny list: an argument
we do not know about makes entries miss, never restore into a child they do not fit).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence

__all__ = ["kv_identity"]

# Flags (with their value) that change where or how fast a child runs, never its cells.
_NEUTRAL_WITH_VALUE = frozenset(
    {
        "--port",
        "--host",
        "-t",
        "--threads",
        "-tb",
        "--threads-batch",
        "-C",
        "--cpu-mask",
        "-Cr",
        "--cpu-range",
        "--cpu-strict",
        "--poll",
        "-a",
        "--alias",
        "--slot-save-path",
        "-to",
        "--timeout",
        "--api-key",
        "--threads-http",
        "--log-file",
        "--log-verbosity",
        "-lv",
        "--sleep-idle-seconds",
    }
)
_NEUTRAL_FLAGS = frozenset(
    {
        "--metrics",
        "--log-colors",
        "--no-webui",
        "--log-timestamps",
        "--cache-idle-slots",  # where an idle slot's cells wait, not what they are
        "--no-cache-idle-slots",
    }
)


def _file_stamp(path: str) -> str:
    try:
        st = os.stat(path)
    except OSError:
        return ""
    return f"{st.st_size}:{st.st_mtime_ns}"


def kv_identity(argv: Sequence[str]) -> str:
    """A short hash naming the KV layout of a child started with ``argv`` (the binary
    first). Every file named on the line counts with its size and modification time,
    so a changed model (or engine) gets a new identity and its old entries never fit."""
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in _NEUTRAL_WITH_VALUE:
            skip = "=" not in arg
            continue
        if name in _NEUTRAL_FLAGS:
            continue
        kept.append(arg)
        if os.path.isfile(arg):
            kept.append(_file_stamp(arg))
    return hashlib.sha256("\0".join(kept).encode()).hexdigest()[:20]
