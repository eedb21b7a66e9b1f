"""Recognising out-of-memory and backend failures in a child's log (Jan's patterns).

Jan's rules: a line is "oom" if it mentions a device/host allocation failure, else
"backend" for CUDA errors, GGML asserts, Vulkan or Metal errors. The first such line
explains the child's death better than its last lines, which are usually cleanup.
"""

from __future__ import annotations

import enum
import re

__all__ = ["LogKind", "classify_line", "describe_exit_signal", "oom_device"]


class LogKind(enum.Enum):
    OOM = "out of memory"
    BACKEND = "backend error"


_OOM_ANY = (
    "erroroutofdevicememory",
    "erroroutofhostmemory",
    "cuda_error_out_of_memory",
    "cudaerrormemoryallocation",
    "out of memory",
)
# The CUDA engine's words for a load that does not fit (llama.cpp b11434):
#   ggml_backend_cuda_buffer_type_alloc_buffer: allocating 812.00 MiB on device 1:
#       cudaMalloc failed: out of memory
#   alloc_tensor_range: failed to allocate CUDA1 buffer of size 851443712
#   llama_model_load: error loading model: unable to allocate CUDA1 buffer
#   llama_init_from_model: failed to initialize the context: failed to allocate compute pp buffers
_DEVICE_NAMED = re.compile(r"\b(CUDA)(\d+)\b")
_DEVICE_NUMBER = re.compile(r"\bon device (\d+)")


def classify_line(line: str) -> LogKind | None:
    low = line.lower()
    if (
        any(s in low for s in _OOM_ANY)
        or ("failed to allocate" in low and "buffer" in low)
        or ("unable to allocate" in low and "buffer" in low)
        or ("failed to allocate compute" in low)
    ):
        return LogKind.OOM
    if (
        "cuda error:" in low
        or "ggml_assert(" in low
        or ("ggml_vulkan" in low and "error" in low)
        or ("ggml_metal" in low and "error" in low)
    ):
        return LogKind.BACKEND
    return None


def oom_device(line: str) -> str | None:
    """The engine's id of the device an out-of-memory line names (``CUDA1``), if any."""
    m = _DEVICE_NAMED.search(line)
    if m is not None:
        return f"{m[1]}{m[2]}"
    m = _DEVICE_NUMBER.search(line)
    if m is not None and "cuda" in line.lower():
        return f"CUDA{m[1]}"
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
