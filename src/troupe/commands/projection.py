"""The engine's own memory projections for ``troupe doctor``: the figure a router admits
models by (its measure jobs, `troupe.actors.measure`), so doctor and ``GET /models``
show one need for one model, each named by its source.

Each model's projection runs with exactly the argv the router's own projection uses
(`troupe.specs.projection_argv`: the child's, one thread, the KV store's layout),
two at a time; a model the engine cannot project (``--fit off``, an unreadable file)
keeps the GGUF header's estimate.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import trio

from troupe.actors.measure import MeasureJob
from troupe.catalog import Catalog
from troupe.catalog.facts import FactsCache
from troupe.catalog.figure import kv_swa_full
from troupe.messages import Measured, Message
from troupe.specs import projection_argv

__all__ = ["engine_needs"]

AT_ONCE = 2  # projections in parallel (each on one thread)
# A projection takes ~0.3 s for a tiny model, ~2 s for Gemma 3 270M at 32k (one thread,
# idle priority); one that takes longer (fit searching for a context that fits, a busy
# machine) falls back to the estimate rather than holding doctor up for the router's 60 s.
DOCTOR_TIMEOUT = 20.0


def engine_needs(
    catalog: Catalog, engine: str, facts: FactsCache, *, kv_store: bool
) -> dict[str, Mapping[str, int]]:
    """Bytes per device each model's child would take, by model, where the engine said;
    ``kv_store``: the router's KV store is on (its children's KV layout, `kv_swa_full`)."""
    return trio.run(_needs, catalog, engine, facts, kv_store)


async def _needs(
    catalog: Catalog, engine: str, facts: FactsCache, kv_store: bool
) -> dict[str, Mapping[str, int]]:
    entries = [e for e in catalog if e.model_path is not None]
    send, receive = trio.open_memory_channel[Message](len(entries) or 1)
    limiter = trio.CapacityLimiter(AT_ONCE)
    found: dict[str, Mapping[str, int]] = {}
    async with trio.open_nursery() as nursery, send:
        for entry in entries:
            swa_full = kv_swa_full(entry, facts, kv_store)
            argv = projection_argv(catalog, entry, engine, os.environ, swa_full)
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
