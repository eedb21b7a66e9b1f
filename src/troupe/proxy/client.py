"""The relay's two ends of one exchange: the client's side it writes to (`Client`, the
HTTP server's exchange or anything shaped like it) and what it saw (`RelayReport`, for
the access log, the usage counts and the KV store), and `ChildLost`, a child's
connection broken after the answer had started."""

from __future__ import annotations

from typing import Protocol

import attrs

__all__ = ["TAIL_BYTES", "ChildLost", "Client", "RelayReport"]


class Client(Protocol):
    """The client's side of one exchange (`troupe.http.server.exchange.Exchange`)."""

    @property
    def method(self) -> str: ...

    @property
    def headers(self) -> list[tuple[bytes, bytes]]: ...

    @property
    def path(self) -> str: ...

    @property
    def framing(self) -> bool: ...

    @property
    def started(self) -> bool: ...

    @property
    def server_stopping(self) -> bool: ...

    @property
    def target(self) -> bytes: ...

    def head(self, status: int, fields: bytes, *, length: int | None) -> bytes: ...

    def chunk(self, data: bytes) -> bytes: ...

    @property
    def last_chunk(self) -> bytes: ...

    async def send(self, data: bytes) -> None: ...

    async def respond(self, status: int, body: bytes, content_type: str | bytes = ...) -> None: ...


TAIL_BYTES = 8192  # the end of an answer kept for its usage and timings (the last event)


@attrs.define(slots=True)
class RelayReport:
    """What the relay saw of one request, for the access log: filled as it goes."""

    status: int = 0
    bytes_out: int = 0  # response body bytes relayed
    first_byte: float | None = None  # trio time the head went to the client
    first_body: float | None = None  # trio time the first body bytes did
    sse: bool = False
    error: str | None = None  # why the relay failed, when it did
    tokens: int = 0  # a stream's events that carried text (a cut stream's count)
    whole: bool = False  # the whole answer was written (a client leaving after it did not)
    # The answer's last reads, at least TAIL_BYTES of them when there were that many:
    # references only (no copy per read); joined once, at the end.
    _reads: list[bytes] = attrs.field(factory=list)
    _kept: int = 0

    def keep(self, data: bytes) -> None:
        reads = self._reads
        reads.append(data)
        self._kept += len(data)
        if len(reads) > 8 and self._kept - len(reads[0]) >= TAIL_BYTES:
            self._kept -= len(reads.pop(0))  # a short list: the pop is cheap

    @property
    def tail(self) -> bytes:
        """The answer's last bytes (its usage and timings). Joined once: the reads are
        replaced by the join, so the KV store's reading and the access record's share it."""
        reads = self._reads
        if len(reads) > 1:
            reads[:] = [b"".join(reads)]
        joined = reads[0] if reads else b""
        return joined[-TAIL_BYTES:] if len(joined) > TAIL_BYTES else joined


class ChildLost(Exception):
    """The child's connection broke after the response had started."""
