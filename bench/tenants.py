"""Fair queuing across tenants: a flood of one tenant against two interactive ones.

One model (Gemma 3 270M, the demo file; ``-c CTX`` and otherwise the engine's defaults:
``--parallel`` auto, 4 slots). Three tenants: ``batch`` sends ``--flood`` (200) chat
requests at once; ``alice`` and ``bob`` (interactive) each send a streamed chat request
every ``--every`` seconds (3, staggered) while the flood lasts. Per side, side by side:

- ``tenants``: a tenants file (``--tenants``): class ``interactive`` (priority 10,
  ``--reserved`` slots kept for it: 2, one per interactive tenant, whose streams overlap:
  each takes about as long as the period between them) for alice and bob, class
  ``batch`` for batch, every weight 1;
- ``equal``: the same three as ``--named-api-keys``: every key equal (one class, weight
  1), fair queuing by least attained service only;
- ``shared`` (``--sides``): one key for all three, one tenant: arrival order, as before
  fair queuing (troupe still caps a child's requests at its slots).

Printed per side: the interactive tenants' time to first token (p50, p95) during the
flood, the batch tenant's throughput (generated tokens per second, first request sent
to last answer), and Jain's fairness index over tokens served per weight among
backlogged tenants: a second phase where ``batch2`` and ``batch3`` (same class, weight
1, neither served before: the flooding ``batch`` has attained service that least-attained
scheduling rightly counts against it for a minute or so) each send ``--pair`` requests at
once, counted until the first of them is done (both backlogged until then). Keep
``--pair`` well above the child's 4 slots.
And, on the ``tenants`` side's router, the interactive
time to first token with no flood and the batch throughput alone (within the
reservation); on the ``equal`` side's, the batch throughput alone with every slot, and
per side the interactive tenants' own generated tokens per second during the flood: the
engine's total (batch + interactive) against batch alone with every slot says whether
capacity was lost or only shared.

    .venv/bin/python bench/tenants.py [--flood 200] [--every 3] [--sides tenants,equal]

Goals (the tenants issue): interactive p95 during the flood <= 1.5x its value with no
flood; Jain's index >= 0.95; batch throughput >= 0.9x of batch alone.
"""

from __future__ import annotations

import argparse
import json
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from _util import percentile, serving
from troupe.demo import assemble_demo_model
from troupe.engine import find_engine

KEYS = {
    "alice": "k-alice-1",
    "bob": "k-bob-2",
    "batch": "k-batch-3",
    "batch2": "k-batch-4",
    "batch3": "k-batch-5",
}
SHARED = "k-shared"
TENANTS_TOML = """
[classes.interactive]
priority = 10
reserved_slots = {reserved}

[classes.batch]
priority = 0
"""
TOPICS = ["the harbour", "the lighthouse", "the old mill", "the market", "the ferry"]


def ask(url: str, key: str, text: str, max_tokens: int, stream: bool, timeout: float) -> dict:
    """One chat request at temperature 0: its time to first token (streamed) or to the
    answer, and the tokens its answer used. Raises when it is not answered."""
    parts = urlsplit(url)
    body = json.dumps(
        {
            "model": "gemma-a",
            "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": stream,
            **({"stream_options": {"include_usage": True}} if stream else {}),
        }
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {parts.netloc}\r\nconnection: close\r\n"
        f"authorization: Bearer {key}\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()
    start = time.perf_counter()
    first: float | None = None
    buf = b""
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as sock:
        sock.sendall(head + body)
        while True:
            sock.settimeout(max(0.1, timeout - (time.perf_counter() - start)))
            data = sock.recv(65536)
            if not data:
                break
            if first is None and stream and b'"content":"' in data:
                first = time.perf_counter() - start
            buf += data
    ended = time.perf_counter() - start
    head_end = buf.find(b"\r\n\r\n")
    status = buf[9:12]
    if status != b"200":
        raise RuntimeError(f"status {status!r}: {buf[-300:]!r}")
    usage: dict[str, Any] = {}
    text_body = buf[head_end + 4 :]
    if stream:
        for line in text_body.split(b"\n"):
            if line.startswith(b"data: {") and b'"usage"' in line:
                usage = json.loads(line[6:]).get("usage") or usage
    else:
        start_json = text_body.find(b"{")
        usage = json.loads(text_body[start_json : text_body.rfind(b"}") + 1]).get("usage") or {}
    return {
        "ttft": first if first is not None else ended,
        "done": ended,
        "prompt": int(usage.get("prompt_tokens") or 0),
        "completion": int(usage.get("completion_tokens") or 0),
    }


def run_threads(fns: list[Callable[[], None]]) -> list[threading.Thread]:
    threads = [threading.Thread(target=f) for f in fns]
    for t in threads:
        t.start()
    return threads


def flood(url: str, key: str, n: int, args: argparse.Namespace, log: list[dict]) -> float:
    """``n`` requests of ``key`` at once; returns when all are answered (seconds)."""
    lock = threading.Lock()
    began = time.perf_counter()

    def one(i: int) -> None:
        text = f"Request {i}: write about {TOPICS[i % len(TOPICS)]} in one paragraph."
        try:
            got = ask(url, key, text, args.max_tokens, False, args.timeout)
            got["at"] = time.perf_counter()  # when it was answered
        except (OSError, RuntimeError) as exc:
            got = {"failed": str(exc)}
        with lock:
            log.append(got)

    for t in run_threads([lambda i=i: one(i) for i in range(n)]):
        t.join()
    return time.perf_counter() - began


def interactive(
    url: str, keys: list[str], until: threading.Event, args: argparse.Namespace
) -> list:
    """Each key sends a streamed request every ``--every`` s (staggered) until ``until``:
    each one's time to first token and generated tokens (None: not answered)."""
    ttfts: list[tuple[float, int] | None] = []
    lock = threading.Lock()
    threads: list[threading.Thread] = []

    def one(key: str, n: int) -> None:
        try:
            answer = ask(
                url, key, f"Question {n}: what is {TOPICS[n % 5]}?", args.max_tokens, True,
                args.timeout,
            )  # fmt: skip
            got: tuple[float, int] | None = (answer["ttft"], answer["completion"])
        except (OSError, RuntimeError):
            got = None
        with lock:
            ttfts.append(got)

    began = time.perf_counter()
    step = args.every / len(keys)
    n = 0
    while not until.is_set():
        key = keys[n % len(keys)]
        threads += run_threads([lambda key=key, n=n: one(key, n)])
        n += 1
        until.wait(max(0.0, began + n * step - time.perf_counter()))
    for t in threads:
        t.join()
    return ttfts


def throughput(log: list[dict], seconds: float) -> float:
    return sum(r.get("completion", 0) for r in log) / seconds if seconds > 0 else 0.0


def jain(values: list[float]) -> float:
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values)) if any(values) else 0.0


def side(kind: str, engine: Path, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    argv = [sys.executable, "-m", "troupe", "serve", "--engine", str(engine),
            "--state-dir", str(tmp / f"state-{kind}"), "--log-level", "warning",
            "--host", "127.0.0.1", "--port", "0", "--models-dir", str(tmp / "models"),
            "--models-max", "1", "-c", str(args.ctx)]  # fmt: skip
    keys = dict(KEYS)
    if kind == "tenants":
        entries = [
            f'[[tenant]]\nname = "{n}"\nkey = "{k}"\nadmin = true\n'
            f'class = "{"batch" if n.startswith("batch") else "interactive"}"\n'
            for n, k in KEYS.items()
        ]
        classes = TENANTS_TOML.format(reserved=args.reserved)
        (tmp / "tenants.toml").write_text(classes + "\n" + "\n".join(entries))
        argv += ["--tenants", str(tmp / "tenants.toml")]
    elif kind == "equal":
        (tmp / "keys").write_text("".join(f"{n}:{k}\n" for n, k in KEYS.items()))
        argv += ["--named-api-keys", str(tmp / "keys")]
    else:
        argv += ["--api-key", SHARED]
        keys = dict.fromkeys(KEYS, SHARED)
    out: dict[str, Any] = {}
    with serving(f"tenants-{kind}", argv, tmp, wait=120, grace=30) as url:
        ask(url, keys["alice"], "hello", 1, True, 300)  # loaded before the clock starts
        if kind == "tenants":
            # Alone: the interactive tenants with no flood, then the batch with no one.
            stop = threading.Event()
            timer = threading.Timer(args.alone, stop.set)
            timer.start()
            quiet = interactive(url, [keys["alice"], keys["bob"]], stop, args)
            out["alone_ttft"] = sorted(t[0] for t in quiet if t is not None)
            log: list[dict] = []
            seconds = flood(url, keys["batch"], args.flood, args, log)
            out["alone_batch"] = throughput(log, seconds)
        elif kind == "equal":
            # The batch tenant alone with every slot: what the reservation costs it.
            log = []
            seconds = flood(url, keys["batch"], args.flood, args, log)
            out["alone_batch_all"] = throughput(log, seconds)
        # The flood with the interactive tenants beside it.
        log = []
        done = threading.Event()
        box: dict[str, Any] = {}

        def batch() -> None:
            box["seconds"] = flood(url, keys["batch"], args.flood, args, log)
            done.set()

        (flooder,) = run_threads([batch])
        time.sleep(1.0)  # the flood's requests are in line first
        ttfts = interactive(url, [keys["alice"], keys["bob"]], done, args)
        flooder.join()
        out["ttft"] = sorted(t[0] for t in ttfts if t is not None)
        out["interactive"] = sum(t[1] for t in ttfts if t is not None) / box["seconds"]
        out["lost"] = sum(1 for t in ttfts if t is None) + sum(1 for r in log if "failed" in r)
        out["batch"] = throughput(log, box["seconds"])
        # Two backlogged tenants of equal weight: tokens served until the first is done.
        logs: dict[str, list[dict]] = {"batch2": [], "batch3": []}
        ends: dict[str, float] = {}

        def pair(name: str, delay: float) -> None:
            time.sleep(delay)
            flood(url, keys[name], args.pair, args, logs[name])
            ends[name] = time.perf_counter()

        for t in run_threads([lambda: pair("batch2", 0.0), lambda: pair("batch3", 0.0)]):
            t.join()
        cut = min(ends.values())
        served = [
            sum(r["prompt"] + r["completion"] for r in logs[n] if r.get("at", 1e9) <= cut)
            for n in ("batch2", "batch3")
        ]
        out["jain"] = jain([float(s) for s in served])
        out["pair"] = served
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flood", type=int, default=200, help="the batch tenant's requests")
    ap.add_argument("--pair", type=int, default=40, help="each of the two floods' requests")
    ap.add_argument("--every", type=float, default=3.0, help="each interactive tenant's period")
    ap.add_argument("--alone", type=float, default=30.0, help="seconds of interactive alone")
    ap.add_argument("--max-tokens", type=int, default=32, help="tokens generated per request")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--sides", default="tenants,equal", help="tenants, equal, shared")
    ap.add_argument(
        "--reserved", type=int, default=2, help="slots the interactive class keeps (tenants)"
    )
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    engine, _ = find_engine()
    kinds = [k for k in args.sides.split(",") if k]
    with tempfile.TemporaryDirectory(prefix="bench-tenants-") as d:
        tmp = Path(d)
        gemma = assemble_demo_model(tmp / "demo")
        (tmp / "models").mkdir()
        (tmp / "models" / "gemma-a.gguf").symlink_to(gemma)
        results = {}
        for k in kinds:
            results[k] = r = side(k, engine, tmp, args)
            print(f"{k}: { {x: y for x, y in r.items() if x not in ('ttft', 'alone_ttft')} }",
                  file=sys.stderr, flush=True)  # fmt: skip
    print(
        f"Gemma 3 270M, -c {args.ctx} (4 slots), batch floods {args.flood} chat requests "
        f"({args.max_tokens} tokens each), alice and bob a streamed one every {args.every:g} s"
        f" (tenants: {args.reserved} slots kept for them):"
    )
    print(
        f"  {'':10}{'TTFT p50':>10}{'p95':>9}{'batch tok/s':>13}{'interactive':>13}"
        f"{'Jain':>7}   lost"
    )
    ok = True
    base = results.get("tenants", {})
    for k, r in results.items():
        t = r["ttft"]
        print(
            f"  {k:10}{percentile(t, 50):9.2f}s{percentile(t, 95):8.2f}s"
            f"{r['batch']:13.1f}{r['interactive']:13.1f}{r['jain']:7.3f}   {r['lost']}"
        )
    if "alone_ttft" in base:
        quiet = base["alone_ttft"]
        p95_quiet = percentile(quiet, 95)
        print(
            f"  alone     {percentile(quiet, 50):9.2f}s{p95_quiet:8.2f}s"
            f"{base['alone_batch']:13.1f}      (interactive with no flood; batch alone)"
        )
        ratio = percentile(base["ttft"], 95) / p95_quiet if p95_quiet else float("inf")
        share = base["batch"] / base["alone_batch"] if base["alone_batch"] else 0.0
        print(
            f"  tenants: p95 flood/alone {ratio:.2f}x (goal <= 1.5), Jain {base['jain']:.3f} "
            f"(goal >= 0.95), batch {share:.2f}x of alone (goal >= 0.9)"
        )
        ok = ratio <= 1.5 and base["jain"] >= 0.95 and share >= 0.9
    if "alone_batch_all" in results.get("equal", {}):
        full = results["equal"]["alone_batch_all"]
        print(f"  batch alone with every slot (equal keys): {full:.1f} tok/s")
        for k, r in results.items():
            total = r["batch"] + r["interactive"]
            print(
                f"  {k}: batch {r['batch'] / full:.2f}x of that; batch + interactive "
                f"{total:.1f} tok/s = {total / full:.2f}x (the engine's work, shared)"
            )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
