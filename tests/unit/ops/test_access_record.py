"""The access record: usage and timings read from an answer's tail, the text line, the ring."""

from __future__ import annotations

import json

from troupe.ops.access import AccessRecord, RequestLog, read_usage
from troupe.proxy.client import TAIL_BYTES, RelayReport


def _rec(**kw: object) -> AccessRecord:
    return AccessRecord(time=0.0, client="127.0.0.1:1", method="POST", path="/x", route="/x", **kw)  # type: ignore[arg-type]


def test_chat_json_answer_usage_and_timings() -> None:
    body = {
        "choices": [{"message": {"content": 'a "usage": trap'}}],
        "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
        "timings": {"prompt_n": 11, "predicted_n": 7, "predicted_per_second": 42.5},
    }
    rec = _rec()
    read_usage(json.dumps(body).encode(), rec)
    assert (rec.prompt_tokens, rec.completion_tokens, rec.tokens_per_second) == (11, 7, 42.5)


def test_sse_tail_last_event_timings_only() -> None:
    events = [
        {"content": "x", "stop": False},
        {"content": "", "stop": True, "timings": {"prompt_n": 3, "predicted_n": 9,
                                                 "predicted_per_second": 100.0}},
    ]  # fmt: skip
    chunks = b"".join(b"%x\r\ndata: %b\n\n\r\n" % (len(json.dumps(e)) + 8, json.dumps(e).encode())
                      for e in events) + b"0\r\n\r\n"  # fmt: skip
    rec = _rec()
    read_usage(chunks, rec)
    assert (rec.prompt_tokens, rec.completion_tokens, rec.tokens_per_second) == (3, 9, 100.0)


def test_answer_without_usage_leaves_tokens_unknown() -> None:
    rec = _rec()
    read_usage(b'{"tokens": [1, 2, 3]}', rec)
    assert rec.prompt_tokens is None
    assert rec.completion_tokens is None


def test_report_keeps_only_the_tail() -> None:
    report = RelayReport()
    for _ in range(50):
        report.keep(b"a" * 1000)
    report.keep(b'{"usage": {"prompt_tokens": 1}}')
    assert len(report.tail) == TAIL_BYTES
    assert report.tail.endswith(b'{"usage": {"prompt_tokens": 1}}')


def test_text_line_and_ring_filter() -> None:
    log = RequestLog(size=3)
    for i, model in enumerate(["a", "b", "a", "a"]):
        log.record(
            _rec(model=model, status=200, duration=0.5, bytes_in=i, error="x y" if i else None)
        )
    assert [r.bytes_in for r in log.recent()] == [3, 2, 1]  # bounded, newest first
    assert [r.bytes_in for r in log.recent("a")] == [3, 2]
    assert [r.bytes_in for r in log.recent(limit=1)] == [3]
    line = next(log.recent()).text()
    assert line.startswith('127.0.0.1:1 "POST /x" 200 model=a duration=500.0ms')
    assert line.endswith('bytes=3/0 error="x y"')
