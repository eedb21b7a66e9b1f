"""CPU time of the access record's own work per request, in process (no sockets, so a
noisy machine moves it little): building the record, reading usage and timings from the
answer's tail, the ring, the per-model metrics, and with ``--access-log on`` the line
(formatted as troupe's text handler does, written in batches of 50 to /dev/null).

    .venv/bin/python bench/access_record.py [--n 50000]

Compare with bench/access_log.py (the whole relay, end to end) and bench/proxy.py.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

from troupe.ops.access import AccessRecord, RequestLog, read_usage
from troupe.ops.logformat import make_formatter
from troupe.ops.metrics import RouterMetrics
from troupe.proxy.client import RelayReport

TAIL = (
    b'data: {"content":"","stop":true,"timings":{"prompt_n":12,"predicted_n":64,'
    b'"predicted_per_second":91.2},"tokens_predicted":64,"tokens_evaluated":12}\n\n'
)


def one(log: RequestLog, chunks: int) -> None:
    report = RelayReport(status=200, sse=True, first_byte=1.0, first_body=1.0)
    for _ in range(chunks):
        report.keep(TAIL)
    rec = AccessRecord(
        time=time.time(), client="127.0.0.1:50000", method="POST", path="/completion",
        route="/completion", model="m", catalogd=True, status=200, queue_wait=0.0001,
        load_wait=0.0, ttfb=0.001, ttft=0.002, duration=0.5, bytes_in=80, bytes_out=9000,
    )  # fmt: skip
    read_usage(report.tail, rec)
    log.record(rec)


def measure(enabled: bool, n: int, chunks: int) -> float:
    metrics = RouterMetrics()
    log = RequestLog(enabled=enabled)
    log.add_listener(metrics.observe_request)
    start = time.process_time()
    for i in range(n):
        one(log, chunks)
        if i % 50 == 49:
            log.flush()
    log.flush()
    return (time.process_time() - start) / n * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=50_000)
    args = ap.parse_args()
    handler = logging.StreamHandler(open(os.devnull, "w"))  # noqa: SIM115
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    print("per request, CPU us (best of 3): record + ring + metrics, then + the log line")
    print(f"{'format':<6} {'events':>6} {'log off':>8} {'log on':>8}")
    for fmt in ("text", "json"):
        handler.setFormatter(make_formatter(fmt))
        for chunks in (1, 64):  # a whole answer; a stream of 64 events (one keep() each)
            off = min(measure(False, args.n, chunks) for _ in range(3))
            on = min(measure(True, args.n, chunks) for _ in range(3))
            print(f"{fmt:<6} {chunks:>6} {off:8.1f} {on:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
