"""Ollama's /api/chat against a streamed /v1/chat/completions on the same prompt.

Starts ``troupe serve`` on a tiny GGUF and, beside it, a standalone ``llama-server``
on the same model with the same arguments (the child "directly"; llama.cpp's router
has no Ollama API, so it has no column here). Then prints:

* the route table's lookup of OpenAI routes with and without the Ollama routes in it
  (what ``/api/*`` adds to every other request: nothing but a larger dict);
* time to first token (median and p90 over N rounds): ``/api/chat`` through troupe
  (NDJSON) vs ``/v1/chat/completions`` through troupe (SSE) vs the child directly;
* one long response (N tokens) through each: pieces/s, and troupe's CPU time per piece
  (its process's user + system time over the response);
* the ratios /api/chat over /v1/chat/completions.

    .venv/bin/python bench/ollama_api.py [--quick] [--rounds N] [--tokens N]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import statistics
import tempfile
import time
import timeit
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

import psutil

from _util import print_child_flags, serve_tiny_both_ways
from troupe.engine import find_engine
from troupe.http.routes import ROUTES
from troupe.ollama import OLLAMA_ROUTES, OLLAMA_UNDER
from troupe_rig import TinyModel, write_tiny_models

MODEL = TinyModel(name="bench-tiny", n_ctx=4096)
CHILD_ARGS = ["--threads", "1", "--ctx-size", str(MODEL.n_ctx), "--parallel", "1"]
PROMPT = "hello"


def stream(url: str, route: str, max_tokens: int) -> tuple[float, int, float]:
    """(seconds to the first content piece, content pieces, seconds in all)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=120)
    messages = [{"role": "user", "content": PROMPT}]
    if route == "/api/chat":
        body: dict[str, object] = {"model": MODEL.name, "messages": messages,
                                   "options": {"num_predict": max_tokens}}  # fmt: skip
    else:
        body = {"model": MODEL.name, "stream": True, "max_tokens": max_tokens,
                "messages": messages}  # fmt: skip
    t0 = time.perf_counter()
    first, pieces = 0.0, 0
    try:
        conn.request("POST", route, json.dumps(body), {"content-type": "application/json"})
        resp = conn.getresponse()
        for line in resp:
            if route == "/api/chat":
                content = json.loads(line).get("message", {}).get("content")
            elif line.startswith(b"data: {"):
                delta = json.loads(line[6:])["choices"]
                content = delta[0]["delta"].get("content") if delta else None
            else:
                continue
            if content:
                pieces += 1
                first = first or time.perf_counter() - t0
    finally:
        conn.close()
    return first, pieces, time.perf_counter() - t0


def lookups() -> list[tuple[str, float, float]]:
    extended = ROUTES.extended(OLLAMA_ROUTES, OLLAMA_UNDER)
    out = []
    for method, path in (("POST", "/v1/chat/completions"), ("POST", "/completion"),
                         ("POST", "/slots/0"), ("GET", "/no/such/route")):  # fmt: skip
        n = 200_000
        alone = min(timeit.repeat(partial(ROUTES.find, method, path), number=n)) / n
        both = min(timeit.repeat(partial(extended.find, method, path), number=n)) / n
        out.append((f"{method} {path}", alone, both))
    return out


def median_p90(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few rounds, a short long response")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--tokens", type=int, default=2000, help="length of the long response")
    args = parser.parse_args()
    print_child_flags(CHILD_ARGS)
    rounds, tokens = (5, 300) if args.quick else (args.rounds, args.tokens)
    print("route lookup (ns)                       llama.cpp's   + /api/*   ratio")
    for name, alone, both in lookups():
        print(f"  {name:<36} {alone * 1e9:10.0f} {both * 1e9:10.0f} {both / alone:7.2f}x")
    engine, _ = find_engine()
    with (
        tempfile.TemporaryDirectory(prefix="troupe-bench-ollama-") as tmp_name,
        contextlib.ExitStack() as stack,
    ):
        tmp = Path(tmp_name)
        (model,) = write_tiny_models(tmp / "models", [MODEL])
        urls, procs = serve_tiny_both_ways(stack, tmp, engine, model, MODEL.name, CHILD_ARGS)
        troupe_proc = psutil.Process(procs["troupe"].pid)
        ways = {
            "/api/chat via troupe": (urls["troupe"], "/api/chat"),
            "/v1/chat via troupe": (urls["troupe"], "/v1/chat/completions"),
            "/v1/chat direct": (urls["direct"], "/v1/chat/completions"),
        }
        for url, route in ways.values():  # loads the model; warms every path
            stream(url, route, 1)
        ttft: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(rounds):  # interleaved, so a change in machine load hits all alike
            for name, (url, route) in ways.items():
                ttft[name].append(stream(url, route, 1)[0])
        long: dict[str, tuple[int, float, float]] = {}
        for name, (url, route) in ways.items():
            before = troupe_proc.cpu_times()
            _, pieces, total = stream(url, route, tokens)
            after = troupe_proc.cpu_times()
            cpu = (after.user - before.user) + (after.system - before.system)
            long[name] = (pieces, total, cpu)
    print(f"time to first token, {rounds} rounds (ms)    median      p90")
    for name, values in ttft.items():
        med, p90 = median_p90(values)
        print(f"  {name:<28} {med * 1000:12.2f} {p90 * 1000:8.2f}")
    print(f"long response, {tokens} tokens     pieces   pieces/s   troupe CPU us/piece")
    for name, (pieces, total, cpu) in long.items():
        per = cpu / pieces * 1e6 if pieces else 0.0
        print(f"  {name:<28} {pieces:6d} {pieces / total:10.0f} {per:12.1f}")
    api, v1 = long["/api/chat via troupe"], long["/v1/chat via troupe"]
    ratio_t = statistics.median(ttft["/api/chat via troupe"]) / statistics.median(
        ttft["/v1/chat via troupe"]
    )
    rate = (api[0] / api[1]) / (v1[0] / v1[1])
    cpu_ratio = (api[2] / api[0]) / (v1[2] / v1[0]) if api[0] and v1[0] and v1[2] else 0.0
    print("ratios /api/chat over /v1/chat (via troupe)   first token   pieces/s   CPU/piece")
    print(f"  {'':<44} {ratio_t:9.2f}x {rate:9.2f}x {cpu_ratio:9.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
