"""One record per proxied request: the access log line, the recent-requests ring and the
per-model request metrics all read the same `AccessRecord`.

The request path fills an `AccessRecord` as the request goes (its wait for the model,
then the relay's figures: status, first byte, bytes, and the child's own ``usage`` and
``timings`` read from the tail of its answer) and hands it to `RequestLog.record` once,
when the request ends, whatever the outcome. The ring is bounded; the log line is
written only with ``--access-log on``.
"""

from __future__ import annotations

import collections
import json
import logging
import operator
import re
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import trio

from troupe.api import last_object
from troupe.ops.access_lines import LineFormat, direct_format

__all__ = ["ALL_KINDS", "DEFAULT_KINDS", "AccessRecord", "RequestLog", "read_usage"]

log = logging.getLogger("troupe.access")

RING_SIZE = 512  # recent requests kept for GET /troupe/requests and the dashboard
# The router's own routes, kept apart: a dashboard polling every few seconds must not
# push the model requests out of the ring.
LOCAL_RING_SIZE = 256
ALL_KINDS = frozenset({"proxied", "realtime", "local", "forwarded"})
# The model traffic ("forwarded": a cluster node sent it on to the node that served it).
DEFAULT_KINDS = frozenset({"proxied", "realtime", "forwarded"})
# Recorded and logged, not counted by the listeners (request metrics, usage): a read of
# a child's state, or a request another node served (that node counts it).
_NOT_COUNTED = frozenset({"local", "forwarded"})
PENDING_MAX = 10_000  # access lines not yet written (beyond: the oldest are dropped)
WRITE_EVERY = 0.05  # seconds: lines go out in batches, one write each, off the request path


# What nginx's access log escapes (``escape=default``): '"', '\\', bytes under 0x20 and
# from 0x7f up, each as \xHH of its UTF-8 bytes. A request line cannot forge another.
_UNSAFE = re.compile(r"[^\x20\x21\x23-\x5b\x5d-\x7e]")


def _hex(match: re.Match[str]) -> str:
    return "".join(f"\\x{b:02X}" for b in match.group().encode("utf-8", "surrogatepass"))


def escape(text: str) -> str:
    """``text`` as nginx writes a field of its access log (one line, ASCII)."""
    return _UNSAFE.sub(_hex, text) if _UNSAFE.search(text) else text


@attrs.define(slots=True)
class AccessRecord:
    """What one proxied request did; times in seconds from its arrival."""

    time: float  # wall clock (epoch seconds) of its arrival
    client: str
    method: str
    path: str
    route: str  # the bounded route label (metrics)
    model: str = ""
    status: int = 0
    queue_wait: float | None = None  # waiting for a slot (or in the queue)
    load_wait: float | None = None  # waiting for the model's child to load
    ttfb: float | None = None  # the answer's first byte went to the client
    ttft: float | None = None  # a stream's first event after its head (first token)
    duration: float = 0.0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    tokens_per_second: float | None = None  # the child's own generation speed
    bytes_in: int = 0
    bytes_out: int = 0
    stream: bool = False
    catalogd: bool = False  # ``model`` is the catalog's name (else what was asked)
    conversation: str | None = None
    error: str | None = None  # why it failed, when it did
    kind: str = "proxied"  # proxied (to a child), local (the router's own), realtime
    close_code: int | None = None  # a realtime session's WebSocket close code
    # Whose it is: the name of its API key when several keys are configured, else "";
    # with several keys, a tenant's /troupe/requests shows only its own records.
    tenant: str = ""
    in_flight: bool = False  # begun, not ended yet (GET /troupe/requests shows it too)
    node: str = ""  # kind "forwarded": the cluster node that served it (its server name)

    def to_json(self) -> dict[str, Any]:
        # attrgetter reads every field in one C call (attrs.asdict: 4x slower).
        out = dict(zip(_FIELDS, _GET_FIELDS(self), strict=True))
        for key in _SECONDS:
            value = out[key]
            if value is not None:
                out[key] = round(value, 4)
        return out

    def text(self) -> str:
        """The access log's text form: one line, ``key=value`` after the request line."""
        parts = [
            f'{escape(self.client)} "{escape(self.method)} {escape(self.path)}" {self.status} '
            f"model={escape(self.model) if self.model else '-'}"
        ]
        # Unrolled (this runs once per line written): the waits, then the answer's times.
        if self.queue_wait is not None:
            parts.append(f"queue={self.queue_wait * 1000:.1f}ms")
        if self.load_wait is not None:
            parts.append(f"load={self.load_wait * 1000:.1f}ms")
        if self.ttfb is not None:
            parts.append(f"ttfb={self.ttfb * 1000:.1f}ms")
        if self.ttft is not None:
            parts.append(f"ttft={self.ttft * 1000:.1f}ms")
        parts.append(f"duration={self.duration * 1000:.1f}ms")
        if self.prompt_tokens is not None or self.completion_tokens is not None:
            parts.append(f"tokens={self.prompt_tokens or 0}+{self.completion_tokens or 0}")
        if self.tokens_per_second is not None:
            parts.append(f"tps={self.tokens_per_second:.1f}")
        parts.append(f"bytes={self.bytes_in}/{self.bytes_out}")
        if self.conversation:
            parts.append(f"conv={escape(self.conversation)}")
        if self.kind != "proxied":
            parts.append(f"kind={self.kind}")
        if self.node:
            parts.append(f"node={escape(self.node)}")
        if self.close_code is not None:
            parts.append(f"close={self.close_code}")
        if self.error:
            parts.append(f"error={json.dumps(self.error)}")
        return " ".join(parts)


_FIELDS = tuple(f.name for f in attrs.fields(AccessRecord))
_GET_FIELDS = operator.attrgetter(*_FIELDS)
_SECONDS = ("queue_wait", "load_wait", "ttfb", "ttft", "duration", "tokens_per_second")


def _int(obj: dict[str, Any] | None, key: str) -> int | None:
    value = obj.get(key) if obj is not None else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_usage(tail: bytes, record: AccessRecord) -> None:
    """The child's ``usage`` and ``timings`` (llama-server puts both in a JSON answer
    and in a stream's last event), from the last bytes of its answer."""
    if b'"timings"' not in tail and b'"usage"' not in tail:
        return
    usage = last_object(tail, b"usage")
    timings = last_object(tail, b"timings")
    prompt = _int(usage, "prompt_tokens") or _int(usage, "input_tokens")
    completion = _int(usage, "completion_tokens") or _int(usage, "output_tokens")
    if timings is not None:
        prompt = prompt if prompt is not None else _int(timings, "prompt_n")
        completion = completion if completion is not None else _int(timings, "predicted_n")
        speed = timings.get("predicted_per_second")
        if isinstance(speed, int | float) and not isinstance(speed, bool) and speed > 0:
            record.tokens_per_second = float(speed)
    record.prompt_tokens = prompt
    record.completion_tokens = completion


class RequestLog:
    """The recent requests (a bounded ring), the access log line, and whoever else
    wants each record as it ends (the metrics)."""

    def __init__(self, *, enabled: bool = False, size: int = RING_SIZE) -> None:
        self.enabled = enabled  # --access-log: one log line per request
        self._ring: collections.deque[AccessRecord] = collections.deque(maxlen=size)
        self._local: collections.deque[AccessRecord] = collections.deque(maxlen=LOCAL_RING_SIZE)
        self._listeners: list[Callable[[AccessRecord], None]] = []
        self._recorded = trio.Event()  # set (and replaced) at a record someone waits for
        self._waiting = 0
        self._pending: collections.deque[AccessRecord] = collections.deque(maxlen=PENDING_MAX)
        self._wake = trio.Event()
        self._direct_key: tuple[int, int, int] | None = None
        self._direct_fn: LineFormat | None = None
        self._open: dict[int, AccessRecord] = {}  # begun and not ended, by id

    def opened(self, rec: AccessRecord) -> None:
        """A request began: listed (``in_flight``) until `record` ends it."""
        rec.in_flight = True
        self._open[id(rec)] = rec

    def abandon(self, rec: AccessRecord) -> None:
        """A request begun (`opened`) that gets no record after all (one a cluster node
        meant to forward and then served itself: that record is the one kept)."""
        self._open.pop(id(rec), None)

    def add_listener(self, listener: Callable[[AccessRecord], None]) -> None:
        self._listeners.append(listener)

    def record(self, rec: AccessRecord) -> None:
        """A proxied request ended: the ring, the listeners (metrics), the log line. A
        read of a child's state (``GET /slots``: kind "local") is not model traffic:
        the local ring, as `record_other`."""
        if self._open.pop(id(rec), None) is not None:
            rec.in_flight = False
        if rec.kind in _NOT_COUNTED:
            self.record_other(rec)
            return
        self._ring.append(rec)
        for listener in self._listeners:
            listener(rec)
        self._written(rec)

    def record_other(self, rec: AccessRecord) -> None:
        """A router-local request or a realtime session ended: its ring and the log
        line, not the listeners (the request metrics count proxied requests)."""
        (self._local if rec.kind == "local" else self._ring).append(rec)
        self._written(rec)

    def _written(self, rec: AccessRecord) -> None:
        if self.enabled:
            self._pending.append(rec)
            self._wake.set()
        if self._waiting:
            self._recorded.set()
            self._recorded = trio.Event()

    async def wait_until(self, predicate: Callable[[AccessRecord], bool]) -> AccessRecord:
        """The newest record of an ended request that matches ``predicate``, waiting
        for it (no polling)."""
        while True:
            ended = (r for r in self.recent(kinds=ALL_KINDS) if not r.in_flight)
            found = next((r for r in ended if predicate(r)), None)
            if found is not None:
                return found
            self._waiting += 1
            try:
                await self._recorded.wait()
            finally:
                self._waiting -= 1

    async def write_lines(self) -> None:
        """Write the access lines as they come, a batch per ``WRITE_EVERY`` (run it in
        the service's nursery; without it, lines wait in a bounded buffer)."""
        try:
            while True:
                await self._wake.wait()
                self._wake = trio.Event()
                await trio.sleep(WRITE_EVERY)  # let a burst gather: one write for all of it
                self.flush()
        finally:
            self.flush()  # the last requests' lines, as the service stops

    def flush(self) -> None:
        """Write every pending line now, through the ``troupe.access`` logger's handlers:
        troupe's own stream handler gets the batch in one write, made straight from the
        records (`troupe.ops.access_lines`); others get log records."""
        if not self._pending or not log.isEnabledFor(logging.INFO):
            self._pending.clear()
            return
        pending = list(self._pending)
        self._pending.clear()
        batch: list[logging.LogRecord] | None = None  # made only for a handler that wants them
        for handler in _handlers(log):
            if handler.level > logging.INFO:
                continue
            if type(handler) is logging.StreamHandler:
                direct = self._direct(handler)
                if direct is not None:
                    text = "".join(direct(rec) for rec in pending)
                else:
                    batch = batch or [_log_record(rec) for rec in pending]
                    text = "".join(handler.format(r) + handler.terminator for r in batch)
                handler.acquire()
                try:
                    handler.stream.write(text)
                    handler.flush()
                finally:
                    handler.release()
            else:
                batch = batch or [_log_record(rec) for rec in pending]
                for record in batch:
                    handler.handle(record)

    def _direct(self, handler: logging.StreamHandler[Any]) -> LineFormat | None:
        """`direct_format` for ``handler``, worked out again only when its formatter
        changes (the config file may set another after start-up)."""
        key = (id(handler), id(handler.formatter), len(handler.filters))
        if self._direct_key != key:
            self._direct_key, self._direct_fn = key, direct_format(handler, log.name)
        return self._direct_fn

    def recent(
        self,
        model: str | None = None,
        limit: int | None = None,
        kinds: frozenset[str] = DEFAULT_KINDS,
        tenant: str = "",
    ) -> Iterator[AccessRecord]:
        """Newest first by arrival (requests still in flight among them); only
        ``model``'s when given, only records of ``kinds``; only ``tenant``'s when given
        (else everyone's)."""
        count = 0
        found = [*self._ring, *self._open.values()]
        if "local" in kinds:
            found += self._local
        found.sort(key=_began)
        for rec in reversed(found):
            if rec.kind not in kinds or (model and rec.model != model):
                continue
            if tenant and rec.tenant != tenant:
                continue
            if limit is not None and count >= limit:
                return
            count += 1
            yield rec


def _began(rec: AccessRecord) -> float:
    return rec.time


_TEMPLATE: dict[str, object] | None = None
_START: float = getattr(logging, "_startTime", 0.0)  # what relativeCreated counts from


def _log_record(rec: AccessRecord) -> logging.LogRecord:
    """The access line as a log record, made from a template: ``makeRecord`` (the caller,
    thread and process lookups) costs more than the line itself."""
    global _TEMPLATE  # noqa: PLW0603  (made once, in the thread that writes the lines)
    if _TEMPLATE is None:
        _TEMPLATE = log.makeRecord(log.name, logging.INFO, "", 0, "", (), None).__dict__
    record = logging.LogRecord.__new__(logging.LogRecord)
    fields = dict(_TEMPLATE)
    created = rec.time + rec.duration  # when the request ended
    fields.update(
        msg=rec.text(),
        created=created,
        msecs=int((created - int(created)) * 1000) + 0.0,
        relativeCreated=(created - _START) * 1000,
        model=rec.model or None,
        access=rec,
    )
    record.__dict__ = fields
    return record


def _handlers(logger: logging.Logger) -> list[logging.Handler]:
    """The handlers a record of ``logger`` reaches, as `Logger.callHandlers` walks them."""
    found: list[logging.Handler] = []
    current: logging.Logger | None = logger
    while current is not None:
        found += current.handlers
        if not current.propagate:
            break
        current = current.parent
    return found
