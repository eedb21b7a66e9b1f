"""What each tenant used, to bill from, and its budgets, kept across restarts.

`Usage` is the ledger: per tenant, per UTC day, per model, the requests served and the
tokens the engine counted (prompt and generated, from the answer's own ``usage`` /
``timings`` as the access record reads them), and the requests refused by a limit, by
reason. `Accounts` holds it beside the budgets (`troupe.tenants.budget.Budgets`):

- `Accounts.admit` (the lease, before the scheduler wait) checks and reserves;
- the reservation is settled when the request's access record ends (`on_record`, a
  `RequestLog` listener: the same record, the same figures as the access log), or at
  the lease's end for a request without a record (a realtime response);
- `Accounts.run` (a task of the service's nursery) writes ``usage.json`` in the state
  directory every `SAVE_EVERY` seconds when something changed, and once more as the
  service stops: to a temporary file, fsync'ed, renamed over the old one.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

import trio

from troupe.tenants.book import TenantBook
from troupe.tenants.budget import (
    DAY,
    Admitted,
    Budgets,
    Refusal,
    Reservation,
    counts_tokens,
    estimate,
    limited,
)
from troupe.tenants.model import Limits

__all__ = ["SAVE_EVERY", "Accounts", "Usage", "day_name"]

log = logging.getLogger("troupe.tenants")

SAVE_EVERY = 5.0  # seconds between writes of the counters (only when they changed)
KEEP_DAYS = 400  # days of usage kept (older days are dropped at a save)
FILE_NAME = "usage.json"
VERSION = 1


def day_name(day: int) -> str:
    """A UTC day number (epoch seconds // 86400) as ``YYYY-MM-DD``."""
    return time.strftime("%Y-%m-%d", time.gmtime(day * DAY))


class Record(Protocol):
    """What the ledger reads of an access record (`troupe.ops.access.AccessRecord`)."""

    time: float
    tenant: str
    model: str
    catalogd: bool
    status: int
    prompt_tokens: int | None
    completion_tokens: int | None


class Usage:
    """(tenant, day, model) -> [requests, prompt tokens, generated tokens], and
    (tenant, day, reason) -> requests refused."""

    def __init__(self) -> None:
        self.served: dict[tuple[str, int, str], list[int]] = {}
        self.refused: dict[tuple[str, int, str], int] = {}
        self.changed = False

    def add(self, tenant: str, day: int, model: str, prompt: int, completion: int) -> None:
        row = self.served.get((tenant, day, model))
        if row is None:
            row = self.served[(tenant, day, model)] = [0, 0, 0]
        row[0] += 1
        row[1] += prompt
        row[2] += completion
        self.changed = True

    def refuse(self, tenant: str, day: int, reason: str) -> None:
        key = (tenant, day, reason)
        self.refused[key] = self.refused.get(key, 0) + 1
        self.changed = True

    def rows(
        self, tenants: Callable[[str], bool], first: int = 0, last: int | None = None
    ) -> list[dict[str, Any]]:
        """One row per (tenant, day, model) of the tenants ``tenants`` lets through,
        days ``first``..``last``; refusals as rows of model "" (nothing was served)."""
        keys = {(t, d, m) for (t, d, m) in self.served} | {
            (t, d, "") for (t, d, _r) in self.refused
        }
        out = []
        for tenant, day, model in sorted(keys):
            if not tenants(tenant) or day < first or (last is not None and day > last):
                continue
            requests, prompt, completion = self.served.get((tenant, day, model), (0, 0, 0))
            row: dict[str, Any] = {
                "tenant": tenant,
                "day": day_name(day),
                "model": model,
                "requests": requests,
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            }
            if not model:
                row["rejected"] = {
                    r: n for (t, d, r), n in sorted(self.refused.items()) if (t, d) == (tenant, day)
                }
            out.append(row)
        return out

    def prune(self, today: int) -> None:
        first = today - KEEP_DAYS
        for table in (self.served, self.refused):
            for key in [k for k in table if k[1] < first]:
                del table[key]

    def to_json(self) -> dict[str, Any]:
        self.changed = False
        return {
            "served": [[t, d, m, *row] for (t, d, m), row in self.served.items()],
            "refused": [[t, d, r, n] for (t, d, r), n in self.refused.items()],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Usage:
        usage = cls()
        for item in data.get("served", ()):
            with contextlib.suppress(TypeError, ValueError):
                t, d, m, requests, prompt, completion = item
                usage.served[(str(t), int(d), str(m))] = [
                    int(requests),
                    int(prompt),
                    int(completion),
                ]
        for item in data.get("refused", ()):
            with contextlib.suppress(TypeError, ValueError):
                t, d, r, n = item
                usage.refused[(str(t), int(d), str(r))] = int(n)
        return usage


class Accounts:
    """The budgets and the usage ledger of one router, and their file."""

    def __init__(
        self, book: TenantBook, path: Path | None = None, clock: Callable[[], float] = time.time
    ) -> None:
        self.book = book
        self.path = path
        self.clock = clock
        self.budgets = Budgets()
        self.usage = Usage()
        # Reservations to settle when their access record ends: id(record) -> both
        # (the record is kept, so its id is not reused meanwhile).
        self._pending: dict[int, tuple[object, Reservation]] = {}

    # -- the request path ----------------------------------------------------------------

    def limits(self, tenant: str) -> Limits | None:
        """``tenant``'s limits when it has any (None: nothing to count)."""
        if not tenant:
            return None
        found = self.book.current.named(tenant)
        if found is None or not limited(found.limits):
            return None
        return found.limits

    def admit(self, tenant: str, limits: Limits, body: bytes) -> Admitted | Refusal:
        """Check and reserve, in one step (no await): ``body`` is the request's JSON."""
        cost = None
        if counts_tokens(limits):
            found = self.book.current.named(tenant)
            klass = self.book.current.klass(found) if found is not None else None
            cost = estimate(body, klass.default_max_tokens if klass else 1024)
        now = self.clock()
        verdict = self.budgets.admit(tenant, limits, cost, now)
        if isinstance(verdict, Refusal):
            self.usage.refuse(tenant, int(now // DAY), verdict.reason)
        return verdict

    def settle(self, reservation: Reservation, used: int | None) -> None:
        if not reservation.tokens:
            return
        found = self.book.current.named(reservation.tenant)
        limits = found.limits if found is not None else Limits()
        self.budgets.settle(reservation, used, limits, self.clock())

    def settle_with(self, record: object, reservation: Reservation) -> None:
        """Settle ``reservation`` when ``record`` ends (`on_record`)."""
        if reservation.tokens:
            self._pending[id(record)] = (record, reservation)

    def on_record(self, rec: Record) -> None:
        """A proxied request's record ended (a `RequestLog` listener): count it, and
        settle its reservation from the engine's own counts."""
        prompt, completion = rec.prompt_tokens, rec.completion_tokens
        pending = self._pending.pop(id(rec), None) if self._pending else None
        if pending is not None:
            known = prompt is not None or completion is not None
            self.settle(pending[1], (prompt or 0) + (completion or 0) if known else None)
        if rec.catalogd and rec.status != 429:
            self.usage.add(
                rec.tenant, int(rec.time // DAY), rec.model, prompt or 0, completion or 0
            )

    # -- the file --------------------------------------------------------------------------

    @classmethod
    def load(cls, book: TenantBook, path: Path) -> Accounts:
        """The accounts saved in ``path`` (none there, or unreadable: fresh ones; the
        unreadable file is kept beside, as ``usage.json.bad``)."""
        accounts = cls(book, path)
        try:
            data = json.loads(path.read_bytes())
            if not isinstance(data, dict) or data.get("version") != VERSION:
                raise ValueError("not a troupe usage file")
            accounts.budgets = Budgets.from_json(data.get("budgets") or {})
            accounts.usage = Usage.from_json(data.get("usage") or {})
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            log.warning("%s: unreadable (%s); counters start from zero", path, exc)
            with contextlib.suppress(OSError):
                path.replace(path.with_name(path.name + ".bad"))
        return accounts

    @property
    def changed(self) -> bool:
        return self.budgets.changed or self.usage.changed

    def document(self) -> bytes:
        """The file's bytes as of now (made on the event loop: one consistent view)."""
        now = self.clock()
        self.usage.prune(int(now // DAY))
        return json.dumps(
            {
                "version": VERSION,
                "saved": now,
                "budgets": self.budgets.to_json(),
                "usage": self.usage.to_json(),
            },
            separators=(",", ":"),
        ).encode()

    def save(self) -> None:
        """Write the file now (atomically); a failure is logged, never raised."""
        if self.path is not None:
            _write(self.path, self.document())

    async def run(self) -> None:
        """Save every `SAVE_EVERY` seconds when something changed, and as the service
        stops (run it in the service's nursery)."""
        try:
            while True:
                await trio.sleep(SAVE_EVERY)
                if self.path is not None and self.changed:
                    await trio.to_thread.run_sync(_write, self.path, self.document())
        finally:
            self.save()  # the last requests' counts (the HTTP server drained first)

    def tenants_seen(self) -> list[str]:
        """Every tenant the ledger has a row for."""
        return sorted(
            {t for (t, _d, _m) in self.usage.served} | {t for (t, _d, _r) in self.usage.refused}
        )


def _write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        tmp.replace(path)
        directory = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)  # the rename itself survives a power cut
        finally:
            os.close(directory)
    except OSError as exc:
        log.warning("could not save the usage counters to %s: %s", path, exc)
