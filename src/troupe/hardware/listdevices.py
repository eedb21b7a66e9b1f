"""``llama-server --list-devices``: the devices an engine build itself can use (parsed as Jan does).

llama.cpp prints on stdout (``common_print_available_devices``)::

    Available devices:
      CUDA0: NVIDIA GeForce RTX 4090 (24564 MiB, 23980 MiB free)

one line per non-CPU device, or ``  (none)``. The parser follows Jan's: lines
before the header are ignored (a build may log first), the id is the text up to
the first colon, and the memory is the *last* parenthesised group that reads
``N MiB, M MiB free``, because descriptions may hold parentheses of their own
(``Intel(R) Arc(tm) A750 Graphics (DG2)``). A line that does not parse (``(none)``,
a log line) is skipped; no header at all is an error.
"""

from __future__ import annotations

import logging
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

import attrs

from troupe.errors import TroupeError
from troupe.procs import run_captured

__all__ = [
    "DeviceListError",
    "ListedDevice",
    "parse_list_devices",
    "run_list_devices",
]

log = logging.getLogger(__name__)

HEADER = "Available devices:"
MIB = 1 << 20
_PAREN = re.compile(r"\(([^()]*)\)")  # innermost groups, as Jan's "next ')'" scan finds them
_BACKEND = re.compile(r"^([A-Za-z]+)")


class DeviceListError(TroupeError):
    """An engine's ``--list-devices`` failed or printed something else."""


@attrs.frozen
class ListedDevice:
    """One device as an engine build reports it; memory in MiB as printed."""

    id: str  # "CUDA0", "Vulkan1"
    name: str  # the description: "NVIDIA GeForce RTX 4090"
    total_mib: int
    free_mib: int

    @property
    def backend(self) -> str:
        """The id's letters: ``CUDA``, ``Vulkan``, ``ROCm``, ``SYCL``..."""
        m = _BACKEND.match(self.id)
        return m.group(1) if m else self.id

    @property
    def total_bytes(self) -> int:
        return self.total_mib * MIB

    @property
    def free_bytes(self) -> int:
        return self.free_mib * MIB


def _leading_int(part: str) -> int | None:
    words = part.split()
    if not words or "MiB" not in part:
        return None
    try:
        return int(words[0])
    except ValueError:
        return None


def _memory(content: str) -> tuple[int, int] | None:
    if not ("MiB" in content and "free" in content and "," in content):
        return None
    parts = content.split(",")
    if len(parts) != 2:
        return None
    total, free = _leading_int(parts[0]), _leading_int(parts[1])
    return None if total is None or free is None else (total, free)


def _parse_line(line: str) -> ListedDevice | None:
    dev_id, sep, rest = line.strip().partition(":")
    if not sep:
        return None
    rest = rest.strip()
    found: tuple[int, tuple[int, int]] | None = None
    for m in _PAREN.finditer(rest):
        mem = _memory(m.group(1))
        if mem is not None:
            found = (m.start(), mem)  # keep going: the last group wins
    if found is None:
        return None
    start, (total, free) = found
    return ListedDevice(dev_id.strip(), rest[:start].strip(), total, free)


def parse_list_devices(stdout: str) -> tuple[ListedDevice, ...]:
    """The devices in a ``--list-devices`` output; empty for ``(none)``."""
    lines = stdout.splitlines()
    try:
        start = next(i for i, ln in enumerate(lines) if ln.strip() == HEADER)
    except StopIteration:
        raise DeviceListError(f"no '{HEADER}' line in the engine's --list-devices output") from None
    devices = []
    for line in lines[start + 1 :]:
        if not line.strip():
            continue
        dev = _parse_line(line)
        if dev is None:
            log.debug("--list-devices: skipping line %r", line)
            continue
        devices.append(dev)
    return tuple(devices)


Runner = Callable[[list[str], float], "subprocess.CompletedProcess[str]"]


def run_list_devices(
    engine: Path, timeout: float = 30.0, run: Runner = run_captured
) -> tuple[ListedDevice, ...]:
    """Run ``<engine> --list-devices`` (blocking; Jan's 30 s limit) and parse it."""
    try:
        done = run([str(engine), "--list-devices"], timeout)
    except subprocess.TimeoutExpired:
        raise DeviceListError(
            f"engine '{engine}' did not answer --list-devices within {timeout:g} s"
        ) from None
    except OSError as exc:
        raise DeviceListError(
            f"engine '{engine}' cannot be started: {exc.strerror or exc}"
        ) from None
    if done.returncode != 0:
        tail = next((ln.strip() for ln in reversed(done.stderr.splitlines()) if ln.strip()), "")
        detail = f": {tail}" if tail else ""
        raise DeviceListError(
            f"engine '{engine}' --list-devices failed (exit code {done.returncode}){detail}"
        )
    return parse_list_devices(done.stdout)
