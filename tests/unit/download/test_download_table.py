"""The download table (pure): entries, events, cancels and removals, shared files."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from troupe.sched.downloads import CancelJob, DownloadEffect, DownloadTable, RemoveAfter, StartJob
from troupe.sched.effects import Emit, Failure, Reply
from troupe.sched.status import Status


def sse(model: str, event: str, data: dict[str, Any] | None = None) -> dict[str, Any]:
    """An event as a ``/models/sse`` subscriber receives it."""
    return {"model": model, "event": event} | ({} if data is None else {"data": data})


def wire(effects: Sequence[DownloadEffect]) -> list[Any]:
    """``effects`` with each `Emit` as it goes out on the wire."""
    return [e.event.to_json() if isinstance(e, Emit) else e for e in effects]


def test_a_download_from_start_to_finish() -> None:
    t = DownloadTable()
    assert wire(t.start(1, "o/r", frozenset({"o/r/a"}))) == [
        StartJob("o/r", 1),
        sse("o/r", "model_status", {"status": "downloading"}),
        Reply(1, None),
    ]
    assert wire(t.progress("o/r", 1, {"u1": (5, 10)})) == [
        sse("o/r", "download_progress", {"progress": {"u1": {"done": 5, "total": 10}}})
    ]
    cumulative = {"u1": {"done": 5, "total": 10}, "u2": {"done": 1, "total": 2}}
    assert wire(t.progress("o/r", 1, {"u2": (1, 2)})) == [
        sse("o/r", "download_progress", {"progress": cumulative})
    ]
    assert wire(t.progress("o/r", 99, {"u1": (9, 10)})) == []  # a stale job is ignored
    assert wire(t.finished("o/r", 1, "o/r:Q8_0")) == [sse("o/r", "download_finished")]
    view = t.views()["o/r"]
    assert (view.status, view.listed) == (Status.DOWNLOADED, "o/r:Q8_0")
    assert t.ended() == {"o/r": 1}
    t.forget({"o/r": 1})
    assert t.views() == {}


def test_names_and_files_in_use_are_refused() -> None:
    t = DownloadTable()
    t.start(1, "o/r:Q8_0", frozenset({"o/r/blob"}))
    assert wire(t.start(2, "o/r:Q8_0", frozenset())) == [
        Reply(2, Failure.bad_request("model 'o/r:Q8_0' already exists"))
    ]
    shared = "model 'o/r' shares files with 'o/r:Q8_0', which is downloading"
    assert wire(t.start(3, "o/r", frozenset({"o/r/blob", "o/r/x"}))) == [
        Reply(3, Failure.bad_request(shared))
    ]
    assert [type(e) for e in t.start(4, "o/other", frozenset({"o/other/y"}))] == [
        StartJob,
        Emit,
        Reply,
    ]


def test_an_unload_is_answered_when_the_job_ends_and_a_removal_goes_on() -> None:
    t = DownloadTable()
    t.start(1, "o/r", frozenset())
    assert t.cancel(2, "o/r") == [CancelJob("o/r", 1, discard=True)]
    assert t.remove(3, "o/r") == [CancelJob("o/r", 1, discard=True)]
    out = t.failed("o/r", 1, "cancelled", 0, cancelled=True)
    assert wire(out) == [
        sse("o/r", "download_failed", {"reason": "cancelled"}),
        Reply(2, None),
        RemoveAfter(3, "o/r", 1),
    ]
    assert t.cancel(4, "o/r") == [Reply(4, Failure.bad_request("model is not running"))]
    assert t.remove(5, "o/r") == [RemoveAfter(5, "o/r", 1)]
    assert t.cancel(6, "o/none") == [Reply(6, Failure.bad_request("model is not found"))]


def test_a_failure_carries_the_hubs_reason_and_shutdown_pauses_every_job() -> None:
    t = DownloadTable()
    t.start(1, "o/a", frozenset())
    t.start(2, "o/b", frozenset())
    assert wire(t.failed("o/a", 1, "404 Repository not found", 404, cancelled=False)) == [
        sse("o/a", "download_failed", {"reason": "404 Repository not found", "status": 404})
    ]
    assert t.cancel_all() == [CancelJob("o/b", 2, discard=False)]
    t.forget({"o/a": 99})  # another job of that name: kept
    assert set(t.views()) == {"o/a", "o/b"}
