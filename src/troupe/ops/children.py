"""The running children's own metrics (``--metrics``), merged into troupe's exposition.

Scraped at scrape time, all children at once, each bounded by a short timeout, so one
slow child costs a scrape at most that long and never fails it. Through the relay's
pool (the one transport to children, keyed by (model, generation): the child asked is
the one the pool knows running, on the port it started on; one stopping or gone is
never asked), but without a lease: a scrape must never queue, load or keep a model
warm, and llama-server's ``/metrics`` does not wake a sleeping child. Each sample gets
a ``model`` label; families of the same name from several children become one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

import trio
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from troupe.proxy.upstream import UpstreamError, UpstreamPool

__all__ = ["CHILD_SCRAPE_TIMEOUT", "merge_families", "scrape_children"]

log = logging.getLogger("troupe.metrics")

CHILD_SCRAPE_TIMEOUT = 2.0  # seconds, per child; Prometheus's own default timeout is 10 s
MODEL_LABEL = "model"
_HEADERS = ((b"host", b"127.0.0.1"), (b"accept", b"text/plain"))


async def scrape_children(
    pool: UpstreamPool, models: Iterable[str], each: float = CHILD_SCRAPE_TIMEOUT
) -> tuple[dict[str, list[Metric]], dict[str, bool]]:
    """``{model: families}`` of every child that answered, and ``{model: answered}``;
    ``models``: those the scheduler's snapshot shows ready (the child, its generation
    and port, are the pool's)."""
    families: dict[str, list[Metric]] = {}
    up: dict[str, bool] = {}

    async def one(model: str) -> None:
        up[model] = False
        child = pool.live(model)
        if child is None:
            return  # stopped or gone since the snapshot: nothing to ask
        with trio.move_on_after(each):
            try:
                status, body = await pool.fetch(child, "GET", "/metrics", _HEADERS)
            except UpstreamError as exc:
                log.debug("metrics of %s: %s", model, exc)
                return
            if status != 200:
                return  # started without --metrics (501), or not ready
            try:
                text = body.decode("utf-8", "replace")
                families[model] = list(text_string_to_metric_families(text))
            except ValueError as exc:
                log.warning("metrics of %s are not in the Prometheus format: %s", model, exc)
                return
            up[model] = True

    async with trio.open_nursery() as nursery:
        for model in models:
            nursery.start_soon(one, model)
    return families, up


def merge_families(per_model: Mapping[str, Iterable[Metric]]) -> list[Metric]:
    """One family per name, each sample labelled with its model (which replaces any
    ``model`` label of the child's own). A family whose type differs from the first
    child's is left out rather than exposed inconsistently."""
    merged: dict[str, Metric] = {}
    for model in sorted(per_model):
        for family in per_model[model]:
            out = merged.get(family.name)
            if out is None:
                out = Metric(family.name, family.documentation, family.type)
                merged[family.name] = out
            elif out.type != family.type:
                log.warning("metric %s of %s has another type: left out", family.name, model)
                continue
            for s in family.samples:
                labels = {**s.labels, MODEL_LABEL: model}
                out.add_sample(s.name, labels, s.value, s.timestamp, s.exemplar)
    return list(merged.values())
