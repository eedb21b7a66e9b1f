"""Per-request metrics (by model, route and status), observed on the request path for
the price of a dict lookup and a few additions, exposed as Prometheus families at scrape.

prometheus_client's ``Histogram.observe`` takes a lock per bucket and per sum, and
``labels()`` another lock and a check of the label values: several microseconds per
request, a few percent of what relaying a cheap request costs. Every request ends in
the one Trio thread, so plain counts need no lock; a scrape (same thread) turns them
into cumulative histograms. The names, labels and buckets are those a
`prometheus_client.Histogram` would expose.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import CollectorRegistry
from prometheus_client.utils import floatToGoString

__all__ = ["FastHistogram", "RequestMetricsCollector"]


class FastHistogram:
    """One label set's histogram: counts per bucket (not cumulative) and the sum."""

    __slots__ = ("_bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        self._bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound (+Inf only)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # bisect_left: the first bound >= value, as Prometheus' "le" (less or equal).
        self.counts[bisect_left(self._bounds, value)] += 1
        self.sum += value

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        total = 0
        for bound, count in zip(self._bounds, self.counts, strict=False):
            total += count
            out.append((floatToGoString(bound), total))  # type: ignore[no-untyped-call]
        out.append(("+Inf", total + self.counts[-1]))
        return out


class _Family:
    """A histogram family: its label sets' `FastHistogram`, made on first use."""

    def __init__(self, name: str, doc: str, labels: Sequence[str], bounds: Sequence[float]):
        self.name, self.doc, self.labels, self.bounds = name, doc, list(labels), bounds
        self.series: dict[tuple[str, ...], FastHistogram] = {}

    def child(self, *values: str) -> FastHistogram:
        found = self.series.get(values)
        if found is None:
            found = self.series[values] = FastHistogram(self.bounds)
        return found

    def metric(self) -> Metric:
        family = HistogramMetricFamily(self.name, self.doc, labels=self.labels)
        for values, hist in sorted(self.series.items()):
            family.add_metric(list(values), hist.buckets(), hist.sum)
        return family


class _Counters:
    """A counter family: plain numbers by label values."""

    def __init__(self, name: str, doc: str, labels: Sequence[str]) -> None:
        self.name, self.doc, self.labels = name, doc, list(labels)
        self.values: dict[tuple[str, ...], float] = {}

    def inc(self, values: tuple[str, ...], amount: float = 1) -> None:
        self.values[values] = self.values.get(values, 0) + amount

    def metric(self) -> Metric:
        family = CounterMetricFamily(self.name, self.doc, labels=self.labels)
        for values, value in sorted(self.values.items()):
            family.add_metric(list(values), value)
        return family


class RequestMetricsCollector:
    """The families of the per-request metrics, registered once in a registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._families: list[_Family | _Counters] = []
        registry.register(self)

    def histogram(
        self, name: str, doc: str, labels: Sequence[str], bounds: Sequence[float]
    ) -> _Family:
        family = _Family(name, doc, labels, tuple(bounds))
        self._families.append(family)
        return family

    def counter(self, name: str, doc: str, labels: Sequence[str]) -> _Counters:
        family = _Counters(name, doc, labels)
        self._families.append(family)
        return family

    def collect(self) -> Iterator[Metric]:
        for family in self._families:
            yield family.metric()
