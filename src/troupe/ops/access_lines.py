"""The access log's lines written straight from the records, for troupe's own handler.

A line through `logging` costs a `LogRecord` (a dict of twenty fields), the formatter's
``formatTime`` (a ``localtime`` and a ``strftime`` per line) and ``%`` formatting, more
than the line itself. troupe's own stream handler, with the formatter `make_formatter`
gave it, gets the same text made directly: the time's second formatted once per second,
the rest with one f-string. Any other handler or formatter gets real `LogRecord`s.
"""

from __future__ import annotations

import datetime
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from troupe.ops.logformat import TEXT_FORMAT, JsonFormatter

if TYPE_CHECKING:
    from troupe.ops.access import AccessRecord

__all__ = ["LineFormat", "direct_format"]

LineFormat = Callable[["AccessRecord"], str]


class _Seconds:
    """A timestamp's whole-second part, formatted once per second."""

    def __init__(self, render: Callable[[int], str]) -> None:
        self._render = render
        self._second = -1
        self._text = ""

    def __call__(self, second: int) -> str:
        if second != self._second:
            self._second, self._text = second, self._render(second)
        return self._text


def _text_format(logger: str, terminator: str) -> LineFormat:
    """``TEXT_FORMAT``'s line: ``asctime`` as `logging.Formatter.formatTime` writes it
    (local time, ``,mmm``), the level padded to 7, the logger's name."""
    seconds = _Seconds(lambda s: time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s)))
    middle = f" {'INFO':<7} {logger}: "

    def line(rec: AccessRecord) -> str:
        created = rec.time + rec.duration  # when the request ended
        second = int(created)
        msecs = int((created - second) * 1000)
        return f"{seconds(second)},{msecs:03d}{middle}{rec.text()}{terminator}"

    return line


def _json_format(logger: str, terminator: str) -> LineFormat:
    """`JsonFormatter`'s object for an access record."""
    seconds = _Seconds(
        lambda s: datetime.datetime.fromtimestamp(s, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    )

    def line(rec: AccessRecord) -> str:
        created = rec.time + rec.duration
        second = int(created)
        micros = round((created - second) * 1e6)  # as datetime rounds, then milliseconds
        if micros >= 1_000_000:
            second, micros = second + 1, micros - 1_000_000
        msecs = micros // 1000
        out = {
            "time": f"{seconds(second)}.{msecs:03d}+00:00",
            "level": "INFO",
            "logger": logger,
            "model": rec.model or None,
            "message": rec.text(),
            "request": rec.to_json(),
        }
        return json.dumps(out, ensure_ascii=False) + terminator

    return line


def direct_format(handler: logging.Handler, logger: str) -> LineFormat | None:
    """How to write access lines straight to ``handler``'s stream, or None when it
    needs real log records (not a plain stream handler, filters, another formatter)."""
    if type(handler) is not logging.StreamHandler or handler.filters:
        return None
    fmt = handler.formatter
    if type(fmt) is JsonFormatter:
        return _json_format(logger, handler.terminator)
    if (
        type(fmt) is logging.Formatter
        and fmt._fmt == TEXT_FORMAT
        and fmt.datefmt is None
        and fmt.converter is time.localtime
        and fmt.default_msec_format == "%s,%03d"
    ):
        return _text_format(logger, handler.terminator)
    return None
