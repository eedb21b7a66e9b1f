"""The streams being relayed now and how fast their tokens go: the dashboard's live
tokens per second (``troupe_model_stream_tokens_per_second`` in ``GET /metrics``).

The relay counts a stream's text events as it writes them (`RelayReport.tokens`), so a
stream's speed is known while it runs, long before the child's ``timings`` arrive with
its last event. One writer: the request's own task opens and closes its entry; a
scrape reads them (same Trio thread, no await in between).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import trio

from troupe.proxy.client import RelayReport

__all__ = ["LiveRate", "LiveStreams"]


@attrs.frozen
class LiveRate:
    streams: int  # streams of the model sending tokens now
    tokens_per_second: float  # their tokens per second, together


class LiveStreams:
    """The proxied requests in flight, by model, with what their relay has sent."""

    def __init__(self, clock: Callable[[], float] = trio.current_time) -> None:
        self._clock = clock
        self._open: dict[int, tuple[str, RelayReport]] = {}

    def open(self, model: str, report: RelayReport) -> None:
        self._open[id(report)] = (model, report)

    def close(self, report: RelayReport) -> None:
        self._open.pop(id(report), None)

    def rates(self) -> dict[str, LiveRate]:
        """Per model with a stream sending tokens: how many, and their tokens per second
        (each stream's text events since its first one, summed)."""
        now = self._clock()
        found: dict[str, LiveRate] = {}
        for model, report in self._open.values():
            began = report.first_body
            if not report.sse or began is None or report.tokens <= 0 or now <= began:
                continue
            speed = report.tokens / (now - began)
            seen = found.get(model)
            if seen is not None:
                speed += seen.tokens_per_second
            found[model] = LiveRate((seen.streams if seen else 0) + 1, speed)
        return found
