"""The tenant probe: can tenant B learn tenant A's prompt from the KV store?

``troupe serve`` with its KV store, two named keys (``--named-api-keys``), the real engine
and Gemma 3 270M (the demo model), one slot (``--parallel 1``: B's request must take the
slot that holds A's conversation, the hardest case). Each round has a fresh secret
prompt (about 330 tokens, its first line unique). "with": A sends the secret, then B
sends the secret plus a guessed ending; "without": A sends an unrelated prompt of the same
length, then B sends a secret nobody sent. B's time to first token (streamed, temperature
0) and the tokens the answer says were cached (``usage.prompt_tokens_details.cached_tokens``
and ``timings.cache_n``), median over the rounds, side by side: with the tenants kept
apart they are equal within noise and B's cached tokens 0.

The same rounds with one key shared by A and B (one tenant, where reusing A's prefix is
right) show what the probe sees when the prefix is reused. And the alternative to
``"cache_prompt": false`` that troupe splices into B's request: erasing the slot first
(``POST /slots/0?action=erase``), one more round trip per foreign slot, timed here.

``--kv-store off``: troupe without the store's files (with several keys its slots are
still kept apart by tenant); ``both``: the store on, then off.

    .venv/bin/python bench/kv_tenants.py [--rounds 5] [--parallel 1] [--kv-store on|off|both]
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from _util import serving
from troupe.demo import assemble_demo_model
from troupe.engine import find_engine

BODY = "Keep the harbour records in order, and read them aloud each evening. " * 22


def secret(rng: random.Random) -> str:
    code = rng.randrange(10**8)
    words = " ".join(rng.choice(("north", "amber", "quiet", "river", "stone")) for _ in range(6))
    return f"Vault {code}: {words}. The access code is {rng.randrange(10**4):04d}. {BODY}"


def request(
    url: str, key: str, method: str, path: str, body: dict[str, Any] | None
) -> tuple[float, bytes]:
    """One request with ``key``: seconds to the first ``data:`` event (a stream: the
    engine sends it with the first token) or to the whole answer, and the answer's bytes."""
    parts = urlsplit(url)
    payload = b"" if body is None else json.dumps(body).encode()
    head = (
        f"{method} {path} HTTP/1.1\r\nhost: {parts.netloc}\r\nconnection: close\r\n"
        f"authorization: Bearer {key}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(payload)}\r\n\r\n"
    ).encode()
    start = time.perf_counter()
    first: float | None = None
    data = b""
    with socket.create_connection((parts.hostname, parts.port), timeout=600) as sock:
        sock.sendall(head + payload)
        while chunk := sock.recv(65536):
            data += chunk
            if first is None and b"data: {" in data:
                first = time.perf_counter() - start
    return (first if first is not None else time.perf_counter() - start), data


def probe(url: str, key: str, prompt: str, **extra: object) -> tuple[float, int, int]:
    """B's streamed completion: time to first token, cached_tokens, timings.cache_n."""
    body = {
        "model": "gemma",
        "prompt": prompt,
        "max_tokens": 2,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }
    ttft, raw = request(url, key, "POST", "/v1/completions", body)
    cached, cache_n = -1, -1
    for raw_line in raw.split(b"\n"):
        line = raw_line.strip()
        if not line.startswith(b"data: {"):
            continue
        event = json.loads(line[6:])
        usage = event.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens", cached)
        cache_n = (event.get("timings") or {}).get("cache_n", cache_n)
    if b" 200 " not in raw.split(b"\r\n", 1)[0]:
        raise RuntimeError(raw[:300].decode("utf-8", "replace"))
    return ttft, int(cached), int(cache_n)


def rounds(url: str, a: str, b: str, n: int, seed: int) -> dict[str, list[tuple[float, int, int]]]:
    rng = random.Random(seed)
    out: dict[str, list[tuple[float, int, int]]] = {"with": [], "without": []}
    probe(url, a, "Hello")  # the model loaded before anything is timed
    for _ in range(n):
        for case in ("with", "without"):
            s = secret(rng)
            other = "Unrelated notes. " + secret(rng)  # shares no prefix with a guess
            probe(url, a, s if case == "with" else other)  # A's conversation on the slot
            guess = (s if case == "with" else secret(rng)) + " The code, again:"
            out[case].append(probe(url, b, guess))
    return out


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def erase_or_not(engine: Path, gemma: Path, tmp: Path, n: int) -> None:
    """The engine alone, one slot holding A's prompt: B's guess sent with
    ``"cache_prompt": false`` (what troupe does), or after erasing the slot (the
    alternative: one more call); B's time to first token and what it reused."""
    argv = [str(engine), "-m", str(gemma), "--host", "127.0.0.1", "--port", str(free_port()),
            "-c", "2048", "--parallel", "1", "--slot-save-path", str(tmp)]  # fmt: skip
    rng = random.Random(2)
    fresh: list[tuple[float, int, int]] = []
    erased: list[tuple[float, int, int]] = []
    erase_s: list[float] = []
    with serving("engine", argv, tmp, wait=120, grace=30) as url:
        probe(url, "", "Hello")
        for _ in range(n):
            s = secret(rng)
            probe(url, "", s)
            fresh.append(probe(url, "", s + " The code, again:", cache_prompt=False))
            probe(url, "", s)
            start = time.perf_counter()
            _, raw = request(url, "", "POST", "/slots/0?action=erase", {})
            erase_s.append(time.perf_counter() - start)
            if b" 200 " not in raw.split(b"\r\n", 1)[0]:
                raise RuntimeError(raw[:300].decode("utf-8", "replace"))
            erased.append(probe(url, "", s + " The code, again:"))
    for label, got in (("cache_prompt false", fresh), ("erase first", erased)):
        print(
            f"engine alone, {label:<18}: B's time to first token median "
            f"{statistics.median(t for t, _, _ in got) * 1000:7.1f} ms, "
            f"cached_tokens {sorted({c for _, c, _ in got})}"
        )
    print(f"engine alone, the erase call itself: median {statistics.median(erase_s) * 1000:.1f} ms")


def serve(engine: Path, tmp: Path, keys: Path, parallel: int, name: str, store: str) -> Any:
    argv = [sys.executable, "-m", "troupe", "serve", "--engine", str(engine),
            "--host", "127.0.0.1", "--port", "0", "--models-dir", str(tmp / "models"),
            "--state-dir", str(tmp / f"state-{name}-{store}"), "--log-level", "warning",
            "--named-api-keys", str(keys), "-c", "2048", "--parallel", str(parallel),
            "--kv-store", store]  # fmt: skip
    return serving(name, argv, tmp, wait=120, grace=30)


def report(label: str, got: dict[str, list[tuple[float, int, int]]]) -> None:
    for case in ("with", "without"):
        ttft = [t for t, _, _ in got[case]]
        cached = sorted({c for _, c, _ in got[case]})
        cache_n = sorted({c for _, _, c in got[case]})
        print(
            f"{label:<22} B {case:<7} A's prefix: time to first token median "
            f"{statistics.median(ttft) * 1000:7.1f} ms (min {min(ttft) * 1000:.1f}, "
            f"max {max(ttft) * 1000:.1f}), cached_tokens {cached}, timings.cache_n {cache_n}"
        )
    ratio = statistics.median(t for t, _, _ in got["with"]) / statistics.median(
        t for t, _, _ in got["without"]
    )
    print(f"{label:<22} with / without: {ratio:.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--parallel", type=int, default=1, help="the child's slots")
    ap.add_argument("--kv-store", choices=("on", "off", "both"), default="on")
    args = ap.parse_args()
    engine, _ = find_engine()
    with tempfile.TemporaryDirectory(prefix="bench-kv-tenants-") as d:
        tmp = Path(d)
        (tmp / "models").mkdir()
        (tmp / "models" / "gemma.gguf").symlink_to(assemble_demo_model(tmp / "demo"))
        two = tmp / "two-keys"
        two.write_text("alice:k-alice\nbob:k-bob\n")
        one = tmp / "one-key"
        one.write_text("shared:k-shared\n")
        print(f"Gemma 3 270M, one child, --parallel {args.parallel}, {args.rounds} rounds")
        for store in ("on", "off") if args.kv_store == "both" else (args.kv_store,):
            with serve(engine, tmp, two, args.parallel, "tenants", store) as url:
                got = rounds(url, "k-alice", "k-bob", args.rounds, 1)
                report(f"store {store}, two keys", got)
            with serve(engine, tmp, one, args.parallel, "one-key", store) as url:
                got = rounds(url, "k-shared", "k-shared", args.rounds, 1)
                report(f"store {store}, one key", got)
        erase_or_not(engine, tmp / "models" / "gemma.gguf", tmp, args.rounds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
