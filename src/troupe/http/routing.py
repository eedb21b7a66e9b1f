"""The route table's shape: (method, path) -> the handler that serves it.

One lookup both classifies a request and dispatches it. Exact routes are one dict
lookup (the hot path: every proxied request goes through it); a few routes own every
path under a prefix (``POST /slots/:id``, the dashboard's files). Paths are looked up
without the ``--api-prefix``. The table itself is `troupe.http.routes.ROUTES`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable

import attrs

from troupe.assembly import Troupe
from troupe.http.server.exchange import Exchange

__all__ = ["DASHBOARD", "Handler", "RouteTable", "is_dashboard"]

Handler = Callable[[Troupe, Exchange], Awaitable[None]]
DASHBOARD = "/troupe"  # the dashboard's pages (troupe.http.dashboard), clear of the web UI's


def is_dashboard(route: str) -> bool:
    """The dashboard's page and static files (public, like the web UI: they hold no data):
    ``/troupe``, ``/troupe/`` and the files under it, each named with an extension. Its
    data (``/troupe/requests``, ``/troupe/history``, ``/troupe/version``: names without
    one) needs the key, as every other route does."""
    if route == DASHBOARD:
        return True
    if not route.startswith(DASHBOARD + "/"):
        return False
    name = route.rpartition("/")[2]
    return not name or "." in name


@attrs.frozen
class Under:
    """Every path ``prefix + rest`` for ``method`` (``rest`` one segment if ``segment``)."""

    method: str
    prefix: str
    handler: Handler
    segment: bool = False  # rest must be one non-empty path segment (no "/")

    def matches(self, method: str, route: str) -> bool:
        if method != self.method or not route.startswith(self.prefix):
            return False
        rest = route[len(self.prefix) :]
        return not self.segment or (bool(rest) and "/" not in rest)


class RouteTable:
    def __init__(
        self, exact: Iterable[tuple[tuple[str, str], Handler]], under: Iterable[Under] = ()
    ) -> None:
        self._exact: dict[tuple[str, str], Handler] = {}
        for key, handler in exact:
            if key in self._exact:
                raise ValueError(f"route {key[0]} {key[1]} is in the table twice")
            self._exact[key] = handler
        self._under = tuple(under)

    def extended(
        self, exact: Iterable[tuple[tuple[str, str], Handler]], under: Iterable[Under] = ()
    ) -> RouteTable:
        """This table and more routes (another API's, plugged in by the service)."""
        return RouteTable([*self._exact.items(), *exact], [*self._under, *under])

    def find(self, method: str, route: str) -> Handler | None:
        """The handler for ``method route`` (``route`` without the API prefix), or None."""
        handler = self._exact.get((method, route))
        if handler is not None:
            return handler
        for entry in self._under:
            if entry.matches(method, route):
                return entry.handler
        return None

    def routes(self) -> list[tuple[str, str]]:
        """Every (method, path) served, prefixes shown with a trailing ``*``."""
        out = sorted(self._exact)
        out += [(u.method, u.prefix + "*") for u in self._under]
        return out
