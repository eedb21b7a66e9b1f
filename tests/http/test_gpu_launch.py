"""A placed child's command line as the real router renders it: no device flag on this
machine (the engine is a CPU build, whatever NVML says), and on a GPU box's mapping the
flags of its plan, which the real engine's parser takes (all but the CUDA device list,
which a CPU build refuses in its device parser)."""

from __future__ import annotations

import os
from pathlib import Path

from troupe.child.argcheck import engine_refusal
from troupe.child.gpu_flags import DEVICE_FLAGS
from troupe.sched.devices import GpuPlan
from troupe_rig.router import open_router


async def test_a_placed_childs_command_line(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    args = ["--models-dir", str(tiny_model_dir)]
    async with open_router(args, engine=engine_path, state_dir=tmp_path / "s") as router:
        specs = router.ctx.specs
        assert specs.gpu_ids == {}  # a CPU build (or no GPU): nothing is placed
        plain = specs.launch_spec("tiny-a")
        argv = list(plain.argv(0))
        assert not set(argv) & {*DEVICE_FLAGS, "--n-gpu-layers"}
        assert plain.env.get("CUDA_DEVICE_ORDER") == os.environ.get("CUDA_DEVICE_ORDER")

        # What build_troupe sets on a box whose engine lists two CUDA cards NVML sees.
        specs.gpu_ids = {"cuda:0": "CUDA0", "cuda:1": "CUDA1"}
        specs.device_names = {"CUDA0": "cuda:0", "CUDA1": "cuda:1"}
        plan = GpuPlan(("cuda:0", "cuda:1"), (30000, 10000), 7)
        spec = specs.launch_spec("tiny-a", None, plan)
        placed = list(spec.argv(0))
        flags = [
            "--device",
            "CUDA0,CUDA1",
            "--split-mode",
            "layer",
            "--tensor-split",
            "30000,10000",
            "--n-gpu-layers",
            "7",
        ]
        # After the child's own, unchanged: the KV store's identity of the child (its
        # slot directory) is the same whichever cards it runs on.
        assert placed == [*argv, *flags]
        assert spec.env["CUDA_DEVICE_ORDER"] == os.environ.get("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        assert spec.device_names == {"CUDA0": "cuda:0", "CUDA1": "cuda:1"}
        assert engine_refusal([*argv, *flags[2:]]) is None
        refusal = engine_refusal(placed)
        assert refusal is not None
        assert "invalid device: CUDA0" in refusal
