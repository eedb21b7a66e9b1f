"""``--log-format``: plain text (the default) or JSON, one object per line.

JSON lines carry ``time``, ``level``, ``logger``, ``model`` and ``message``. A record
about one model says so with ``extra={"model": NAME}`` (a child's stderr lines do);
its text form starts with ``[NAME] ``, which the JSON form moves into ``model``.
"""

from __future__ import annotations

import datetime
import json
import logging

__all__ = ["LOG_FORMATS", "TEXT_FORMAT", "JsonFormatter", "make_formatter"]

TEXT_FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"
LOG_FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        model = getattr(record, "model", None)
        message = record.getMessage()
        if isinstance(model, str) and message.startswith(f"[{model}] "):
            message = message[len(model) + 3 :]
        out: dict[str, object] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "model": model if isinstance(model, str) else None,
            "message": message,
        }
        access = getattr(record, "access", None)
        if access is not None and hasattr(access, "to_json"):
            out["request"] = access.to_json()  # the access log's record, field by field
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(out, ensure_ascii=False)


def make_formatter(fmt: str) -> logging.Formatter:
    """The formatter for a ``--log-format`` value (already checked)."""
    return JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT)
