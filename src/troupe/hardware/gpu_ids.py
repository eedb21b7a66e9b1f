"""Which engine device (``CUDA0``) is which NVML GPU, for placing children on cards.

NVML numbers the GPUs in PCI bus order. The CUDA runtime numbers them fastest first
unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (troupe sets it for its children), and only
the ones ``CUDA_VISIBLE_DEVICES`` lets it see (indices, or ``GPU-`` UUID prefixes).
The engine's ``--list-devices`` says which CUDA devices it can use. A GPU is matched
only where all three agree (the same count, and each card's total memory within 5%);
otherwise nothing is, and troupe places no child on a GPU (the engine's default).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from troupe.hardware.listdevices import ListedDevice
from troupe.hardware.nvml import GpuDevice

__all__ = ["engine_gpu_ids", "gpu_name"]

log = logging.getLogger(__name__)


def gpu_name(index: int) -> str:
    """troupe's name of NVML GPU ``index`` (the memory ledger's device)."""
    return f"cuda:{index}"


def _visible(gpus: Sequence[GpuDevice], environ: Mapping[str, str]) -> list[GpuDevice] | None:
    """The GPUs CUDA sees, in CUDA's order; None when it cannot be told."""
    order = environ.get("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    if order != "PCI_BUS_ID" and len(gpus) > 1:
        return None
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is None:
        return list(gpus)
    out: list[GpuDevice] = []
    for word in (w.strip() for w in listed.split(",")):
        if not word:
            continue
        if word.isdigit():
            found = next((g for g in gpus if g.index == int(word)), None)
        elif word.startswith("GPU-"):
            found = next((g for g in gpus if g.uuid and g.uuid.startswith(word)), None)
        else:
            return None  # MIG instances and the like: not placed by troupe
        if found is None:
            break  # CUDA stops at the first invalid entry
        out.append(found)
    return out


def engine_gpu_ids(
    gpus: Sequence[GpuDevice], listed: Sequence[ListedDevice], environ: Mapping[str, str]
) -> dict[str, str]:
    """troupe's GPU name -> the engine's device id, for every GPU children may be placed
    on; empty when they cannot be matched (then none is placed)."""
    cuda = [d for d in listed if d.backend == "CUDA"]
    visible = _visible(gpus, environ)
    if not cuda or visible is None:
        return {}
    if len(visible) != len(cuda):
        log.warning(
            "GPU placement off: NVML sees %d GPU(s) the engine should use, the engine lists %d",
            len(visible),
            len(cuda),
        )
        return {}
    out: dict[str, str] = {}
    for gpu, dev in zip(visible, cuda, strict=True):
        if abs(dev.total_bytes - gpu.total) > 0.05 * gpu.total:
            log.warning(
                "GPU placement off: %s (%d MiB) does not match NVML's GPU %d (%d MiB)",
                dev.id,
                dev.total_mib,
                gpu.index,
                gpu.total >> 20,
            )
            return {}
        out[gpu_name(gpu.index)] = dev.id
    return out
