"""/v1/realtime against a streamed /v1/chat/completions on the same prompt.

Starts ``troupe serve`` on a tiny GGUF and, beside it, a standalone ``llama-server``
on the same model with the same arguments (the child "directly"; llama.cpp's router
has no WebSocket endpoint, so it has no column here). Then prints:

* time to first delta (median and p90 over N rounds): a realtime out-of-band
  response (``response.create`` to the first ``response.output_text.delta``) vs a
  streamed chat completion through troupe (request to the first content chunk) vs the
  same chat completion sent to the child directly;
* events/s on one long response (N tokens) through each;
* the ratios realtime/chat through troupe and realtime/direct.

Every prompt is the same: one user message, no instructions. The realtime client is
``websockets``' blocking client, the chat client ``http.client``: plain, equal costs.

    .venv/bin/python bench/realtime.py [--quick] [--rounds N] [--tokens N]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import statistics
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from websockets.sync.client import connect

from _util import print_child_flags, serve_tiny_both_ways
from troupe.engine import find_engine
from troupe_rig import TinyModel, write_tiny_models

MODEL = TinyModel(name="bench-tiny", n_ctx=4096)
CHILD_ARGS = ["--threads", "1", "--ctx-size", str(MODEL.n_ctx), "--parallel", "1"]
PROMPT = "hello"


def chat_stream(url: str, max_tokens: int) -> tuple[float, int, float]:
    """(seconds to the first content chunk, content chunks, seconds in all)."""
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=120)
    body = {"model": MODEL.name, "stream": True, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": PROMPT}]}  # fmt: skip
    t0 = time.perf_counter()
    first, events = 0.0, 0
    try:
        conn.request(
            "POST", "/v1/chat/completions", json.dumps(body), {"content-type": "application/json"}
        )
        resp = conn.getresponse()
        for line in resp:
            if not line.startswith(b"data: {"):
                continue
            delta = json.loads(line[6:])["choices"]
            if delta and delta[0]["delta"].get("content"):
                events += 1
                first = first or time.perf_counter() - t0
    finally:
        conn.close()
    return first, events, time.perf_counter() - t0


class Realtime:
    """One realtime session; each response is out of band with the same one-item input."""

    def __init__(self, url: str) -> None:
        ws_url = url.replace("http://", "ws://") + f"/v1/realtime?model={MODEL.name}"
        self.ws = connect(ws_url, max_size=None, compression=None)
        assert json.loads(self.ws.recv())["type"] == "session.created"

    def respond(self, max_tokens: int) -> tuple[float, int, float]:
        item = {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": PROMPT}],
        }
        response = {"conversation": "none", "input": [item], "max_output_tokens": max_tokens}
        t0 = time.perf_counter()
        self.ws.send(json.dumps({"type": "response.create", "response": response}))
        first, events = 0.0, 0
        while True:
            event = json.loads(self.ws.recv())
            kind = event["type"]
            if kind == "response.output_text.delta":
                events += 1
                first = first or time.perf_counter() - t0
            elif kind == "response.done":
                assert event["response"]["status"] in ("completed", "incomplete"), event
                return first, events, time.perf_counter() - t0
            elif kind == "error":
                raise RuntimeError(event["error"]["message"])

    def close(self) -> None:
        self.ws.close()


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
    engine, _ = find_engine()
    with (
        tempfile.TemporaryDirectory(prefix="troupe-bench-rt-") as tmp_name,
        contextlib.ExitStack() as stack,
    ):
        tmp = Path(tmp_name)
        (model,) = write_tiny_models(tmp / "models", [MODEL])
        urls, _ = serve_tiny_both_ways(stack, tmp, engine, model, MODEL.name, CHILD_ARGS)
        chat_stream(urls["troupe"], 1)  # loads the model; warms both
        chat_stream(urls["direct"], 1)
        rt = Realtime(urls["troupe"])
        stack.callback(rt.close)
        rt.respond(1)
        ttfd: dict[str, list[float]] = {"realtime": [], "chat via troupe": [], "chat direct": []}
        for _ in range(rounds):  # interleaved, so a change in machine load hits all alike
            ttfd["realtime"].append(rt.respond(1)[0])
            ttfd["chat via troupe"].append(chat_stream(urls["troupe"], 1)[0])
            ttfd["chat direct"].append(chat_stream(urls["direct"], 1)[0])
        long = {
            "realtime": rt.respond(tokens),
            "chat via troupe": chat_stream(urls["troupe"], tokens),
            "chat direct": chat_stream(urls["direct"], tokens),
        }
    print(f"time to first delta, {rounds} rounds (ms)      median      p90")
    for name, values in ttfd.items():
        med, p90 = median_p90(values)
        print(f"  {name:<28} {med * 1000:12.2f} {p90 * 1000:8.2f}")
    print(f"long response, {tokens} tokens          deltas   events/s")
    for name, (_, events, total) in long.items():
        print(f"  {name:<28} {events:9d} {events / total:10.0f}")
    rt_ttfd = statistics.median(ttfd["realtime"])
    print("ratios (realtime / other)        first delta   events/s")
    for other in ("chat via troupe", "chat direct"):
        ratio_t = rt_ttfd / statistics.median(ttfd[other])
        rate = (long["realtime"][1] / long["realtime"][2]) / (long[other][1] / long[other][2])
        print(f"  realtime / {other:<20} {ratio_t:11.2f}x {rate:9.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
