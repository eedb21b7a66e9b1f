"""The access lines troupe's own handler gets straight from the records are, character
for character, what `logging` makes of the same record with the same formatter."""

from __future__ import annotations

import io
import json
import logging

import pytest

from troupe.ops.access import AccessRecord, RequestLog, _log_record
from troupe.ops.access_lines import direct_format
from troupe.ops.logformat import make_formatter


def _record(time: float) -> AccessRecord:
    return AccessRecord(
        time=time, client="127.0.0.1:5000", method="POST", path="/v1/chat/completions",
        route="/v1/chat/completions", model="tiny", catalogd=True, status=200,
        queue_wait=0.0002, load_wait=0.0, ttfb=0.012, ttft=0.013, duration=0.25,
        prompt_tokens=12, completion_tokens=30, tokens_per_second=120.5, bytes_in=80,
        bytes_out=900, stream=True, conversation="c1", error='a "quoted" failure',
    )  # fmt: skip


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("time", [1_764_670_000.0, 1_764_670_000.5004, 1_764_670_059.998])
def test_direct_line_is_the_logging_line(fmt: str, time: float) -> None:
    handler = logging.StreamHandler(io.StringIO())
    handler.setFormatter(make_formatter(fmt))
    direct = direct_format(handler, "troupe.access")
    assert direct is not None
    rec = _record(time)
    assert direct(rec) == handler.format(_log_record(rec)) + "\n"
    if fmt == "json":
        assert json.loads(direct(rec))["request"]["conversation"] == "c1"


def test_other_handlers_and_formatters_get_log_records() -> None:
    custom = logging.StreamHandler(io.StringIO())
    custom.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    assert direct_format(custom, "troupe.access") is None
    assert direct_format(logging.NullHandler(), "troupe.access") is None

    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    logger = logging.getLogger("troupe.access")
    keep = Keep()
    logger.addHandler(custom)
    logger.addHandler(keep)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        requests = RequestLog(enabled=True)
        requests.record(_record(1_764_670_000.0))
        requests.flush()
    finally:
        logger.removeHandler(custom)
        logger.removeHandler(keep)
        logger.setLevel(old_level)
    stream = custom.stream
    assert isinstance(stream, io.StringIO)
    assert stream.getvalue().startswith('INFO 127.0.0.1:5000 "POST /v1/chat/completions" 200')
    assert [r.getMessage() for r in seen] == [_record(1_764_670_000.0).text()]
    assert seen[0].access.model == "tiny"  # type: ignore[attr-defined]
