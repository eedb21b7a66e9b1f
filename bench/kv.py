"""KV store: a returning conversation after its model was swapped out (and after a
restart of troupe), troupe with its store, troupe with ``--kv-store off`` and
llama.cpp's own (C++) router, the real engine and Gemma 3 270M (the demo model).

Each router gets ``-c CTX --models-max 1`` and two models (the demo file under two
names). Per router: a conversation's first turn (cold: full prefill), its next turn
with the model still loaded (warm), a request to the other model (the swap), the
model loaded back (``POST /models/load``, timed apart: no store makes a load faster)
and the next turn (after the swap); for troupe with its store, a restart of troupe and the
next turn again. Time to first token of a streamed completion (temperature 0), the
tokens the engine evaluated (``timings.prompt_n``), and whether the answer after the
swap is the same words in every router. Ratios are from one run side by side.

Then ``--busy N`` conversations (default 12) interleaved over one child with 4 slots
(the engine's auto ``--parallel``): each one's first turn, then each one's next turn in
the same order, the mean time to first token of the next turns and the tokens the
engine evaluated, side by side and as ratios. troupe with its store keeps each
conversation on its slot while it can, saves the least recently used idle slot before
another conversation takes it and restores a returning one first; without it (and in
the C++ router) the engine alone decides (its RAM prompt cache, ``--cache-ram``, and
``--cache-idle-slots``). Whether each next turn's answer is the same in every router.

    .venv/bin/python bench/kv.py [--tokens 1000] [--ctx 4096]
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.parser import text_string_to_metric_families

from _util import http_json, serving
from troupe.demo import assemble_demo_model
from troupe.engine import find_engine

PARAGRAPH = (
    "The harbour master kept a ledger of every ship that came into the bay, the weather "
    "it brought and the cargo it carried, and each evening he read the day's pages aloud. "
)


def stream(url: str, model: str, prompt: str) -> tuple[float, str, dict[str, Any]]:
    """A streamed completion: seconds to the first token, the text, the engine's timings."""
    parts = urlsplit(url)
    body = json.dumps(
        {"model": model, "prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": True}
    ).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nhost: {parts.netloc}\r\nconnection: close\r\n"
        f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    ).encode()
    start = time.perf_counter()
    first: float | None = None
    text, timings, buf = "", {}, b""
    with socket.create_connection((parts.hostname, parts.port), timeout=600) as sock:
        sock.sendall(head + body)
        while True:
            data = sock.recv(65536)
            if not data:
                break
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                line = line.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                event = json.loads(line[6:])
                for choice in event.get("choices") or []:
                    if choice.get("text"):
                        first = first if first is not None else time.perf_counter() - start
                        text += choice["text"]
                timings = event.get("timings") or timings
    if first is None:
        raise RuntimeError(f"{model}: no token in the answer: {buf[-500:]!r}")
    return first, text, timings


def load(url: str, model: str) -> float:
    """``POST /models/load`` and wait until the model is loaded; the seconds it took."""
    start = time.perf_counter()
    http_json(f"{url}/models/load", {"model": model}, timeout=300)
    while True:
        _, body = http_json(f"{url}/models")
        data = body["data"] if isinstance(body, dict) else []
        status = {m["id"]: m["status"]["value"] for m in data}.get(model)
        if status == "loaded":
            return time.perf_counter() - start
        time.sleep(0.05)


@contextmanager
def router(kind: str, engine: Path, tmp: Path, ctx: int, state: Path) -> Iterator[str]:
    common = ["--host", "127.0.0.1", "--port", "0", "--models-dir", str(tmp / "models"),
              "--models-max", "1", "-c", str(ctx)]  # fmt: skip
    if kind == "cpp":
        argv = [str(engine), *common]
    else:
        argv = [sys.executable, "-m", "troupe", "serve", "--engine", str(engine),
                "--state-dir", str(state), "--log-level", "warning", *common]  # fmt: skip
        if kind == "off":
            argv += ["--kv-store", "off"]
    with serving(f"{kind}-{state.name}", argv, tmp, wait=120, grace=30) as url:
        yield url


def kv_figures(url: str, into: dict[str, float]) -> None:
    """Add troupe's own KV figures from its ``/metrics`` (prometheus_client's parser):
    seconds spent saving and restoring, and the bytes each moved."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = {
                "troupe_kv_save_seconds_sum": "save_s",
                "troupe_kv_save_seconds_count": "saves",
                "troupe_kv_restore_seconds_sum": "restore_s",
                "troupe_kv_restore_seconds_count": "restores",
            }.get(sample.name)
            if sample.name == "troupe_kv_bytes_total":
                key = f"{sample.labels['direction']}_bytes"
            if key is not None:
                into[key] = into.get(key, 0.0) + sample.value


def run(kind: str, engine: Path, tmp: Path, ctx: int, history: str) -> dict[str, Any]:
    state = tmp / f"state-{kind}"
    out: dict[str, Any] = {}
    with router(kind, engine, tmp, ctx, state) as url:
        cold, t1, tm = stream(url, "gemma-a", history)
        out["cold"] = (cold, tm.get("prompt_n"))
        turn = history + t1 + "\n\nThe next morning"
        warm, t2, tm = stream(url, "gemma-a", turn)
        out["warm"] = (warm, tm.get("prompt_n"))
        stream(url, "gemma-b", "Hello")  # the swap: gemma-a is stopped
        turn += t2 + "\n\nThat evening"
        # Loaded back first: the turn's time is the restore or the prefill, not the load.
        out["load"] = load(url, "gemma-a")
        swapped, t3, tm = stream(url, "gemma-a", turn)
        out["after swap"] = (swapped, tm.get("prompt_n"))
        out["text"] = t3
        if kind == "store":
            kv_figures(url, out.setdefault("kv", {}))
    if kind == "store":
        turn += t3 + "\n\nAt dawn"
        with router(kind, engine, tmp, ctx, state) as url:
            load(url, "gemma-a")
            restarted, _, tm = stream(url, "gemma-a", turn)
            out["after restart"] = (restarted, tm.get("prompt_n"))
            kv_figures(url, out["kv"])
    return out


def busy(kind: str, engine: Path, tmp: Path, ctx: int, conversations: int) -> dict[str, Any]:
    """``conversations`` interleaved over a child with 4 slots: each one's first turn,
    then each one's next turn in the same order; the mean of the next turns."""
    state = tmp / f"state-busy-{kind}"
    with router(kind, engine, tmp, ctx, state) as url:
        turns = [f"Conversation {i}: " + PARAGRAPH * 10 for i in range(conversations)]
        for i, turn in enumerate(turns):
            _, text, _ = stream(url, "gemma-a", turn)
            turns[i] = turn + text + "\n\nLater"
        seconds, evaluated, texts = [], [], []
        for turn in turns:
            first, text, tm = stream(url, "gemma-a", turn)
            seconds.append(first)
            evaluated.append(tm.get("prompt_n") or 0)
            texts.append(text)
    return {
        "mean": sum(seconds) / len(seconds),
        "evaluated": sum(evaluated) / len(evaluated),
        "texts": texts,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1000, help="conversation length (about)")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--busy", type=int, default=12, help="conversations over 4 slots (0: skip)")
    ap.add_argument("--busy-only", action="store_true", help="only the busy-slots part")
    args = ap.parse_args()
    engine, _ = find_engine()
    with tempfile.TemporaryDirectory(prefix="bench-kv-") as d:
        tmp = Path(d)
        gemma = assemble_demo_model(tmp / "demo")
        (tmp / "models").mkdir()
        for name in ("gemma-a", "gemma-b"):
            (tmp / "models" / f"{name}.gguf").symlink_to(gemma)
        history = PARAGRAPH * max(1, args.tokens // 32)
        kinds = ("store", "off", "cpp")
        results = (
            {} if args.busy_only else {k: run(k, engine, tmp, args.ctx, history) for k in kinds}
        )
        crowd = {k: busy(k, engine, tmp, args.ctx, args.busy) for k in kinds} if args.busy else {}
    names = {"store": "troupe (store)", "off": "troupe (--kv-store off)", "cpp": "C++ router"}
    same = True
    if results:
        n = results["store"]["cold"][1]
        print(f"Gemma 3 270M, -c {args.ctx}, --models-max 1, conversation of {n} tokens;")
        print("time to first token (tokens the engine evaluated)")
        print(f"{'':16}" + "".join(f"{names[k]:>26}" for k in results))
        for row in ("cold", "warm", "after swap", "after restart"):
            cells = []
            for got in (r.get(row) for r in results.values()):
                cells.append(f"{got[0] * 1000:>13.0f} ms ({got[1]:>5})" if got else f"{'-':>26}")
            print(f"{row:16}" + "".join(f"{c:>26}" for c in cells))
        print(
            f"{'load back':16}" + "".join(f"{results[k]['load'] * 1000:>20.0f} ms" for k in results)
        )
        for k in results:
            ratio = results[k]["after swap"][0] / results[k]["warm"][0]
            print(f"after swap / warm, {names[k]}: {ratio:.2f}x")
        store = results["store"]
        restart = store["after restart"][0] / store["warm"][0]
        print(f"after restart / warm, troupe (store): {restart:.2f}x")
        cpp = results["cpp"]["after swap"][0]
        print(f"after swap, troupe (store) / C++ router: {store['after swap'][0] / cpp:.2f}x")
        print(
            f"after swap, troupe (off) / C++ router: {results['off']['after swap'][0] / cpp:.2f}x"
        )
        kv = store.get("kv", {})
        for what, count in (("save", "saves"), ("restore", "restores")):
            mib = kv.get(f"{what}d_bytes", 0.0) / (1 << 20)
            if mib:
                print(f"troupe's {what}s: {kv[count]:.0f}, {mib:.1f} MiB in "
                      f"{kv[f'{what}_s'] * 1000:.0f} ms: "
                      f"{kv[f'{what}_s'] * 1000 / mib:.2f} ms/MiB")  # fmt: skip
    if crowd:
        print(f"{args.busy} conversations over 4 slots, the next turn of each: mean time to "
              "first token (mean tokens evaluated)")  # fmt: skip
        for k, got in crowd.items():
            print(f"  {names[k]:24} {got['mean'] * 1000:8.0f} ms ({got['evaluated']:.0f})")
        cpp_mean = crowd["cpp"]["mean"]
        for k in ("store", "off"):
            print(f"  {names[k]} / C++ router: {crowd[k]['mean'] / cpp_mean:.2f}x")
        print(
            f"  troupe (store) / troupe (off): {crowd['store']['mean'] / crowd['off']['mean']:.2f}x"
        )
        differ = [i for i, t in enumerate(zip(*(c["texts"] for c in crowd.values()), strict=True))
                  if len(set(t)) > 1]  # fmt: skip
        print(f"  same next-turn answers in every router: {'yes' if not differ else 'NO'}")
        for i in differ:
            print(f"    conversation {i}: " + ", ".join(f"{names[k]} {c['texts'][i]!r}"
                                                      for k, c in crowd.items()))  # fmt: skip
    if results:
        same = len({r["text"] for r in results.values()}) == 1
        print(f"same answer after the swap in every router: {'yes' if same else 'NO'}")
        if not same:
            for k, r in results.items():
                print(f"  {names[k]}: {r['text']!r}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
