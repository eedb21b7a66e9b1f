"""The few calls the KV store makes to a child: ``GET /slots``, a slot's save and
restore, ``/tokenize`` and ``/apply-template``.

Through the one transport to children (`troupe.proxy.upstream.UpstreamPool`), keyed by
(model, generation) like the relay: a call meant for a child that is stopping or gone
is refused before a byte is sent (`ChildGone`), so it never reaches the next child that
took its port. Only the save before a stop is ``final``: sent while the child stops, on
a connection closed after its answer.
"""

from __future__ import annotations

import json
from typing import Any

from troupe.proxy.upstream import Child, Gone, UpstreamError, UpstreamPool

__all__ = ["ChildGone", "EngineApi", "EngineCallFailed"]

_HEADERS = ((b"host", b"127.0.0.1"), (b"content-type", b"application/json"))


class EngineCallFailed(Exception):
    """The child answered with an error, not in a way we can read, or not at all."""


class ChildGone(EngineCallFailed):
    """The child generation is stopping or gone: nothing was sent."""


class EngineApi:
    """The store's calls to children, over the pool."""

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool

    async def call(
        self, child: Child, method: str, path: str, payload: Any = None, *, final: bool = False
    ) -> Any:
        """``method path`` on ``child`` with a JSON body; its JSON answer. Raises
        `EngineCallFailed` on an error status or when it cannot be reached."""
        status, content = await self.fetch(child, method, path, payload, final=final)
        try:
            answer = json.loads(content) if content else None
        except ValueError:
            raise EngineCallFailed(f"{path}: answer is not JSON") from None
        if status >= 400:
            message = answer.get("error", answer) if isinstance(answer, dict) else answer
            raise EngineCallFailed(f"{path}: {status} {message}")
        return answer

    async def fetch(
        self, child: Child, method: str, path: str, payload: Any = None, *, final: bool = False
    ) -> tuple[int, bytes]:
        """``method path`` on ``child`` with a JSON body: its status and body, whatever
        they are. Raises `EngineCallFailed` (`ChildGone`: nothing sent) when there is no
        answer."""
        body = b"" if payload is None else json.dumps(payload).encode()
        try:
            return await self.pool.fetch(child, method, path, _HEADERS, body, final=final)
        except Gone as exc:
            raise ChildGone(f"{path}: {exc}") from None
        except UpstreamError as exc:
            raise EngineCallFailed(f"{path}: {exc}") from None
