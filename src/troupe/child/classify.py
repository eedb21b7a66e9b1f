"""Recognising out-of-memory and backend failures in a child's log (Jan's patterns).

Jan's rules: a line is "oom" if it mentions a device/host allocation failure, else
"backend" for CUDA errors, GGML asserts, Vulkan or Metal errors. The first such line
explains the child's death better than its last lines, which are usually cleanup.
"""

from __future__ import annotations

import enum

__all__ = ["LogKind", "classify_line", "describe_exit_signal"]


class LogKind(enum.Enum):
    OOM = "out of memory"
    BACKEND = "backend error"


_OOM_ANY = (
    "erroroutofdevicememory",
    "erroroutofhostmemory",
    "cuda_error_out_of_memory",
    "out of memory",
)


def classify_line(line: str) -> LogKind | None:
    low = line.lower()
    if any(s in low for s in _OOM_ANY) or ("failed to allocate" in low and "buffer of size" in low):
        return LogKind.OOM
    if (
        "cuda error:" in low
        or "ggml_assert(" in low
        or ("ggml_vulkan" in low and "error" in low)
        or ("ggml_metal" in low and "error" in low)
    ):
        return LogKind.BACKEND
    return None


def describe_exit_signal(signum: int) -> str | None:
    """Advice for a death by signal that usually means a broken engine build."""
    import signal  # noqa: PLC0415

    if signum == signal.SIGILL:
        return (
            "illegal instruction: the engine was built for CPU features this machine cannot use "
            "(rebuild it without -march=native, e.g. CMAKE_ARGS=-DGGML_NATIVE=OFF)"
        )
    return None
