"""Catalog changes under way: a reload waiting for the models it stops, and removals
(``DELETE /models``) waiting for their child to be gone."""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from troupe.sched.table import ModelConfig

__all__ = ["CatalogChanges", "PendingReload"]


@attrs.define
class PendingReload:
    """A reload under way: loads wait until every model in ``restart`` is gone."""

    rid: int  # the latest reload: its catalog wins
    rids: list[int]
    restart: set[str]
    models: tuple[ModelConfig, ...]


@attrs.define
class CatalogChanges:
    reload: PendingReload | None = None
    removals: dict[int, str] = attrs.field(factory=dict)  # rid -> model

    @property
    def reloading(self) -> bool:
        return self.reload is not None

    def fold(
        self, rid: int, restart: Iterable[str], models: Iterable[ModelConfig]
    ) -> PendingReload:
        """A reload asked for while one is under way joins it: its catalog (read later)
        wins, and both are answered together."""
        names = set(restart)
        if self.reload is None:
            self.reload = PendingReload(rid, [rid], names, tuple(models))
        else:
            self.reload.rid = rid
            self.reload.rids.append(rid)
            self.reload.restart |= names
            self.reload.models = tuple(models)
        return self.reload

    def removing(self, model: str) -> bool:
        return model in self.removals.values()
