"""The per-model log store (bounded, readers never block the writer) and the JSON log format."""

from __future__ import annotations

import json
import logging

import pytest
import trio

from troupe.cli import setup_logging
from troupe.errors import UsageError
from troupe.ops.logformat import JsonFormatter
from troupe.ops.logs import ModelLogs
from troupe.sched.events import ChildExited, QueueChanged


def test_the_ring_is_bounded_per_model_and_kept_across_children() -> None:
    logs = ModelLogs(ring=3)
    write_a = logs.writer("a")
    for i in range(5):
        write_a(f"a{i}")
    logs.write("b", "b0")
    logs.on_event(ChildExited("a", 1, expected=False, oom=True))
    logs.on_event(QueueChanged("a", 1, 1, "loading"))  # not a line
    assert [ln.text for ln in logs.recent("a")] == [
        "a3",
        "a4",
        "the child died (exit code 1, out of memory)",
    ]
    assert [ln.source for ln in logs.recent("a")] == ["child", "child", "troupe"]
    assert [ln.text for ln in logs.recent(None)] == ["a3", "a4", "b0", logs.recent("a")[-1].text]
    assert [ln.text for ln in logs.recent("a", 1)] == [logs.recent("a")[-1].text]
    assert logs.recent("a", 0) == []
    assert logs.recent("nobody") == []


async def test_a_slow_reader_loses_its_oldest_lines_and_is_told() -> None:
    logs = ModelLogs(reader_buffer=2)
    with logs.subscribe("a") as a_only, logs.subscribe() as everything:
        for i in range(5):
            logs.write("a", f"line {i}")  # never waits for a reader
        logs.write("b", "other")
        lines, missed = await a_only.receive()
        assert ([ln.text for ln in lines], missed) == (["line 3", "line 4"], 3)
        lines, missed = await everything.receive()
        assert ([ln.text for ln in lines], missed) == (["line 4", "other"], 4)

        async def late_line() -> None:
            await trio.testing.wait_all_tasks_blocked()
            logs.write("a", "late")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(late_line)
            lines, missed = await a_only.receive()
        assert ([ln.text for ln in lines], missed) == (["late"], 0)
        logs.close()
        with pytest.raises(trio.EndOfChannel):
            await a_only.receive()
    with logs.subscribe("a") as after_close, pytest.raises(trio.EndOfChannel):
        await after_close.receive()


def record(message: str, *args: object, model: str | None = None) -> logging.LogRecord:
    rec = logging.LogRecord("troupe.child", logging.INFO, __file__, 1, message, args, None)
    if model is not None:
        rec.model = model
    return rec


def test_json_lines_carry_the_model_and_the_text_prefix_moves_into_it() -> None:
    fmt = JsonFormatter()
    out = json.loads(fmt.format(record("[%s] %s", "m", "srv  load_model: ok", model="m")))
    assert out["model"] == "m"
    assert out["message"] == "srv  load_model: ok"
    assert out["level"] == "INFO"
    assert out["logger"] == "troupe.child"
    assert out["time"].endswith("+00:00")
    out = json.loads(fmt.format(record("plain \u00e9 %d", 3)))
    assert out["model"] is None
    assert out["message"] == "plain \u00e9 3"
    try:
        raise ValueError("boom")
    except ValueError:
        rec = record("failed")
        rec.exc_info = __import__("sys").exc_info()
    assert "ValueError: boom" in json.loads(fmt.format(rec))["exception"]


def test_setup_logging_rejects_an_unknown_format() -> None:
    with pytest.raises(UsageError, match="--log-format: 'xml' \\(text or json\\)"):
        setup_logging("info", "xml")
