"""Log lines about one model: ``about(log, "m").info("stopped")``.

The text form starts with ``[m] `` and the record carries ``model="m"``, which the
JSON log format (`troupe.ops.logformat.JsonFormatter`) moves into its ``model`` field.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

__all__ = ["ModelLog", "about"]


class ModelLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    def __init__(self, logger: logging.Logger, model: str) -> None:
        super().__init__(logger, {"model": model})
        self.model = model

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**kwargs.get("extra", {}), "model": self.model}
        return f"[{self.model}] {msg}", kwargs


def about(logger: logging.Logger, model: str) -> ModelLog:
    return ModelLog(logger, model)
