"""troupe's request parser against h11: generated requests must read the
same in both, or differ by one of troupe's documented choices, each shown here by an
example. A short budget here; ``bench/fuzz_http.py --count 100000`` runs a long one."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from troupe_rig.http_fuzz import (
    CHOICES,
    LENIENT,
    compare,
    explain,
    h11_outcome,
    requests,
    troupe_outcome,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_troupe_reads_requests_as_h11_does_or_by_a_documented_choice(data: bytes) -> None:
    ours, theirs, why = compare(data)
    assert why is not None, (data, ours, theirs)


EXAMPLES = {
    # choice: (request bytes, troupe's outcome kind, h11's)
    "limits": (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: h\r\n\r\n", "error", "request"),
    "obs-fold": (b"GET / HTTP/1.1\r\nHost: h\r\nX: a\r\n b\r\n\r\n", "error", "request"),
    "request-line-spaces": (b"GET /x  HTTP/1.1\r\nHost: h\r\n\r\n", "request", "error"),
    "http2-preface": (b"PRI / HTTP/1.0\r\n\r\n", "error", "request"),
    "unknown-method": (b"FROB / HTTP/1.1\r\nHost: h\r\n\r\n", "error", "request"),
    "leading-empty-lines": (b"\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n", "request", "error"),
    "version": (b"GET / HTTP/1.2\r\nHost: h\r\n\r\n", "error", "request"),
    "target-bytes": (b"GET http://u@h/x HTTP/1.1\r\nHost: h\r\n\r\n", "error", "request"),
    "header-bytes": (b"GET / HTTP/1.1\r\nHost: h\r\nX: a\x7fb\r\n\r\n", "error", "request"),
    "duplicate-content-length": (
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1, 1\r\n\r\nx",
        "error",
        "request",
    ),
    "chunked-and-length": (
        b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n"
        b"\r\n0\r\n\r\n",
        "error",
        "request",
    ),
    "transfer-coding": (
        b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: x\r\nTransfer-Encoding: chunked\r\n"
        b"\r\n0\r\n\r\n",
        "error",
        "error",
    ),
    "bare-lf": (b"GET / HTTP/1.1\nHost: h\n\n", "error", "request"),
    "incomplete-vs-error": (b"GET / HTTP/1.1\r\nHost: h\r\nX:\x00", "error", "incomplete"),
}


@pytest.mark.parametrize("name", [name for name, _ in CHOICES])
def test_each_documented_choice_has_an_example_it_explains(name: str) -> None:
    data, ours_kind, theirs_kind = EXAMPLES[name]
    ours, theirs = troupe_outcome(data), h11_outcome(data)
    assert (ours.kind, theirs.kind) == (ours_kind, theirs_kind)
    assert explain(data, ours, theirs) is not None
    if ours.kind == "request" and theirs.kind != "request":
        assert name in LENIENT


def test_a_repeated_host_or_a_coding_other_than_chunked_is_refused_by_both() -> None:
    for data in (
        b"GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
    ):
        ours, theirs, why = compare(data)
        assert (ours.kind, theirs.kind, why) == ("error", "error", "")
