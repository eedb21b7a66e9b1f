"""The engine's own memory projections for ``troupe doctor``: the figure a router admits
models by (its measure jobs, `troupe.actors.measure`), so doctor and ``GET /models``
show one need for one model, each named by its source.

Each model's projection runs with exactly the argv its child would get (one thread, as
the router's projections do), two at a time; a model the engine cannot project (``--fit
off``, an unreadable file) keeps the GGUF header's estimate.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import trio

from troupe.actors.measure import MeasureJob
from troupe.catalog import Catalog
from troupe.child.cpu_flags import cpu_request
from troupe.child.ports import free_port
from troupe.messages import Measured, Message

__all__ = ["engine_needs"]

AT_ONCE = 2  # projections in parallel (each on one thread)
# A projection takes ~0.3 s; one that takes longer (fit searching for a context that
# fits) falls back to the estimate rather than holding doctor up for the router's 60 s.
DOCTOR_TIMEOUT = 5.0


def engine_needs(catalog: Catalog, engine: str) -> dict[str, Mapping[str, int]]:
    """Bytes per device each model's child would take, by model, where the engine said."""
    return trio.run(_needs, catalog, engine)


async def _needs(catalog: Catalog, engine: str) -> dict[str, Mapping[str, int]]:
    entries = [e for e in catalog if e.model_path is not None]
    send, receive = trio.open_memory_channel[Message](len(entries) or 1)
    limiter = trio.CapacityLimiter(AT_ONCE)
    app_cmd = os.environ.get("LLAMA_APP_CMD", "")
    found: dict[str, Mapping[str, int]] = {}
    async with trio.open_nursery() as nursery, send:
        for entry in entries:
            argv = catalog.child_args(entry, free_port(), bin_path=engine, app_cmd=app_cmd)
            if cpu_request(entry.preset.get_spelling) is None:
                argv += ["--threads", "1", "--threads-batch", "1"]
            job = MeasureJob(
                entry.name,
                "doctor",
                argv,
                {**os.environ, **catalog.child_env(entry)},
                send.clone(),
                DOCTOR_TIMEOUT,
            )

            async def run(job: MeasureJob = job) -> None:
                async with limiter:
                    await job.run()

            nursery.start_soon(run)
    async with receive:
        async for message in receive:
            if isinstance(message, Measured):
                found[message.model] = message.need
    return found
