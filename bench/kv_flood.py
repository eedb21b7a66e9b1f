"""KV store under a flood: does a steady client still get its turn?

One model (Gemma 3 270M, the demo file; ``-c CTX``, the engine's auto ``--parallel``: 4
slots), ``--clients`` (16) flood clients each keeping one chat request in flight (their
own conversation each, about ``--tokens`` of prompt, ``--max-tokens`` generated), and a
steady client that sends a streamed chat request every ``--every`` seconds (2). Per
router, side by side: troupe with its store, troupe with ``--kv-store off`` and
llama.cpp's own (C++) router (``bench/kv.py``'s routers): the steady client's time to
first token (p50, p95, max), and whether every request was answered (the steady
client's within ``--timeout``, the flood's). With the store on, a request waits for a
slot in troupe, in arrival order; before that fix, a woken waiter was picked by Trio's
run order and a steady request could wait past 30 s while later ones took the slots.

    .venv/bin/python bench/kv_flood.py [--seconds 60] [--clients 16] [--sides store,off]

Done when: the p95 with the store on is within 1.2x of the store off. The figures mean
something only where the model serves the steady client's rate on top of the flood's
share (each side's flood answers say how busy it was): on a loaded machine every side's
queue grows through the run, and its times to first token with it.
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
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from _util import percentile
from kv import PARAGRAPH, router
from troupe.demo import assemble_demo_model
from troupe.engine import find_engine

NAMES = {"store": "troupe (store)", "off": "troupe (--kv-store off)", "cpp": "C++ router"}


def chat(url: str, messages: list[dict[str, str]], max_tokens: int, timeout: float) -> float:
    """A streamed chat request at temperature 0: seconds to its first token. Raises
    when it is not answered (an error status, no token, the timeout)."""
    parts = urlsplit(url)
    body = json.dumps(
        {
            "model": "gemma-a",
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
        }
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {parts.netloc}\r\nconnection: close\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()
    start = time.perf_counter()
    first: float | None = None
    done, buf = False, b""
    with socket.create_connection((parts.hostname, parts.port), timeout=timeout) as sock:
        sock.sendall(head + body)
        while True:
            sock.settimeout(max(0.1, timeout - (time.perf_counter() - start)))
            data = sock.recv(65536)
            if not data:
                break
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                line = line.strip()
                if line == b"data: [DONE]":
                    done = True
                elif first is None and line.startswith(b"data: {"):
                    event = json.loads(line[6:])
                    for choice in event.get("choices") or []:
                        if (choice.get("delta") or {}).get("content"):
                            first = time.perf_counter() - start
    if first is None or not done:
        raise RuntimeError(f"not answered: {buf[-300:]!r}")
    return first


def conversation(who: str, tokens: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": f"{who}. " + PARAGRAPH * max(1, tokens // 32)},
        {"role": "user", "content": f"{who}: tell me about the harbour."},
    ]


def flood_side(kind: str, engine: Path, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    state = tmp / f"state-flood-{kind}"
    with router(kind, engine, tmp, args.ctx, state) as url:
        chat(url, conversation("warm-up", 8), 1, 300)  # loaded before the clock starts
        stop = threading.Event()
        lock = threading.Lock()
        flood = {"answered": 0, "failed": 0}
        steady: list[float | None] = []  # time to first token, None: not answered

        def flood_client(i: int) -> None:
            messages = conversation(f"Client {i}", args.tokens)
            while not stop.is_set():
                try:
                    chat(url, messages, args.max_tokens, args.timeout)
                    key = "answered"
                except (OSError, RuntimeError):
                    key = "failed"
                with lock:
                    flood[key] += 1

        def steady_request(n: int) -> None:
            try:
                got: float | None = chat(
                    url, conversation(f"Steady {n}", args.tokens), args.max_tokens, args.timeout
                )
            except (OSError, RuntimeError):
                got = None
            with lock:
                steady.append(got)

        threads = [threading.Thread(target=flood_client, args=(i,)) for i in range(args.clients)]
        for t in threads:
            t.start()
        time.sleep(args.every)  # the flood fills the slots first
        began = time.perf_counter()
        n = 0
        while time.perf_counter() - began < args.seconds:
            t = threading.Thread(target=steady_request, args=(n,))
            t.start()
            threads.append(t)
            n += 1
            time.sleep(max(0.0, began + n * args.every - time.perf_counter()))
        stop.set()
        for t in threads:
            t.join()
    answered = sorted(s for s in steady if s is not None)
    return {
        "sent": n,
        "answered": len(answered),
        "p50": percentile(answered, 50),
        "p95": percentile(answered, 95),
        "max": answered[-1] if answered else float("nan"),
        "flood": flood,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60, help="the steady client's run, per side")
    ap.add_argument("--clients", type=int, default=16, help="flood clients")
    ap.add_argument("--every", type=float, default=2.0, help="the steady client's period (s)")
    ap.add_argument("--tokens", type=int, default=100, help="each conversation's prompt (about)")
    ap.add_argument("--max-tokens", type=int, default=16, help="tokens generated per request")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--timeout", type=float, default=300, help="a request not answered by then")
    ap.add_argument("--sides", default="store,off,cpp", help="which routers, in order")
    args = ap.parse_args()
    # A `timeout` or a kill still stops the routers (the `serving` blocks end).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    engine, _ = find_engine()
    kinds = [k for k in args.sides.split(",") if k]
    if not set(kinds) <= set(NAMES):
        ap.error(f"--sides: one or more of {', '.join(NAMES)}")
    with tempfile.TemporaryDirectory(prefix="bench-kv-flood-") as d:
        tmp = Path(d)
        gemma = assemble_demo_model(tmp / "demo")
        (tmp / "models").mkdir()
        for name in ("gemma-a", "gemma-b"):
            (tmp / "models" / f"{name}.gguf").symlink_to(gemma)
        results = {}
        for k in kinds:
            results[k] = r = flood_side(k, engine, tmp, args)
            print(f"{NAMES[k]}: {r}", file=sys.stderr, flush=True)
    print(
        f"Gemma 3 270M, -c {args.ctx} (4 slots), {args.clients} flood clients "
        f"({args.tokens}-token prompts, {args.max_tokens} tokens each), a steady streamed chat "
        f"every {args.every:g} s for {args.seconds:g} s; its time to first token:"
    )
    print(f"  {'':26}{'p50':>9}{'p95':>9}{'max':>9}   steady answered   flood answered (failed)")
    all_answered = True
    for k, r in results.items():
        f = r["flood"]
        all_answered &= r["answered"] == r["sent"] and f["failed"] == 0
        print(
            f"  {NAMES[k]:26}{r['p50']:8.2f}s{r['p95']:8.2f}s{r['max']:8.2f}s"
            f"   {r['answered']:>4} / {r['sent']:<4}     {f['answered']:>6} ({f['failed']})"
        )
    ratio = 0.0
    if "store" in results and "off" in results:
        ratio = results["store"]["p95"] / results["off"]["p95"]
        print(f"  p95 store / off: {ratio:.2f}x (done when <= 1.2x)")
    print(f"  every request answered: {'yes' if all_answered else 'NO'}")
    return 0 if all_answered and ratio <= 1.2 else 1


if __name__ == "__main__":
    sys.exit(main())
