"""A catalog ready for the scheduler: the model list plus what was worked out from it.

Built off the event loop (it reads GGUF headers) by whoever scans; the scheduler actor
swaps it in whole, at the instant its core takes the new model table, so readers
never see a catalog and a table that disagree.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from troupe.catalog.entry import Catalog, ModelEntry
from troupe.sched.table import ModelConfig

__all__ = ["PreparedCatalog"]


@attrs.frozen
class PreparedCatalog:
    catalog: Catalog
    configs: tuple[ModelConfig, ...]  # what the scheduler core is told about each model
    rejections: Mapping[str, str] = attrs.field(factory=dict)  # model -> why it can't run

    def rejection(self, entry: ModelEntry) -> str | None:
        return self.rejections.get(entry.name)
