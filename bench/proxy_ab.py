"""troupe against troupe: this checkout's and another's (``--other PYTHON``, e.g. main's
venv), side by side on one tiny model and the real engine, measured in alternating
rounds so that a change in machine load hits both alike. Per round: ``POST /tokenize``
at c=8 (req/s and troupe's CPU per request) and one streamed ``/completion`` (events/s
and troupe's CPU per event); then, in front of bench/_relay.py's stand-in child (events
faster than any relay forwards them), one burst stream each (the relay's own cost per
event, the steadiest figure); medians over the rounds, and the ratios this/other.

    .venv/bin/python bench/proxy_ab.py --other /work/main/.venv/bin/python [--rounds 5]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
from pathlib import Path

import psutil

import _relay
from _util import HttpRequest, run_load, start_process
from proxy import CHILD_ARGS, MODEL, Target, _cpu, _find_child, _wait_answers, measure_sse
from troupe.engine import find_engine
from troupe_rig import write_tiny_models


def start(name: str, python: str, engine: Path, tmp: Path, stack: contextlib.ExitStack) -> Target:
    models_dir = tmp / "models"
    argv = [python, "-m", "troupe", "serve", "--engine", str(engine), "--state-dir",
            str(tmp / f"state-{name}"), "--models-dir", str(models_dir), "--host", "127.0.0.1",
            "--port", "0", *CHILD_ARGS]  # fmt: skip
    proc = start_process(name, argv, tmp)
    stack.callback(proc.stop, 15.0)
    url = proc.wait_listening(60)
    _wait_answers(proc, f"{url}/tokenize", {"model": MODEL.name, "content": "hello"}, 60)
    model = models_dir / f"{MODEL.name}.gguf"
    return Target(name, url, proc, _find_child(proc, model), psutil.Process(proc.pid))


def start_relay(name: str, python: str, tmp: Path, stack: contextlib.ExitStack) -> tuple[str, int]:
    """troupe in front of the stand-in child that writes events faster than any relay."""
    argv = [python, "-m", "troupe", "serve", "--engine", str(_relay.write_engine(tmp)),
            "--state-dir", str(tmp / f"relay-{name}"), "--models-dir", str(tmp / "models"),
            "--host", "127.0.0.1", "--port", "0"]  # fmt: skip
    proc = start_process(f"relay-{name}", argv, tmp)
    stack.callback(proc.stop, 15.0)
    url = proc.wait_listening(60)
    _wait_answers(proc, f"{url}/tokenize", {"model": MODEL.name}, 60)
    return url, proc.pid


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--other", required=True, help="the Python of the other checkout's venv")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--n-predict", type=int, default=1500)
    args = ap.parse_args()
    engine = find_engine(None)[0]
    tokenize = HttpRequest(
        "POST", "/tokenize", json.dumps({"model": MODEL.name, "content": "hello world"}).encode()
    )
    rows: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp_s, contextlib.ExitStack() as stack:
        tmp = Path(tmp_s)
        write_tiny_models(tmp / "models", [MODEL])
        targets = [
            start("this", sys.executable, engine, tmp, stack),
            start("other", args.other, engine, tmp, stack),
        ]
        for r in range(args.rounds):
            for target in targets if r % 2 == 0 else targets[::-1]:
                row = rows.setdefault(target.name, {})
                marks: list[float] = []
                proxy = target.proxy

                def mark(marks: list[float] = marks, proxy: psutil.Process | None = proxy) -> None:
                    marks.append(_cpu(proxy))

                load = run_load(target.url, tokenize, 8, args.seconds, 0.5, mark)
                p0, p1 = marks[0], _cpu(proxy)
                row.setdefault("req/s", []).append(load.requests / load.seconds)
                row.setdefault("CPU us/req", []).append((p1 - p0) / load.requests * 1e6)
                sse = measure_sse(target, args.n_predict)
                events = sse.result.events
                row.setdefault("events/s", []).append(sse.result.events_per_s)
                row.setdefault("CPU us/event", []).append(sse.proxy_cpu_s / events * 1e6)
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
        relays = {
            "this": start_relay("this", sys.executable, tmp, stack),
            "other": start_relay("other", args.other, tmp, stack),
        }
        for r in range(args.rounds):
            for name in ("this", "other") if r % 2 == 0 else ("other", "this"):
                url, pid = relays[name]
                burst = _relay.burst(url, MODEL.name, 50_000, 1, pid)
                row = rows[name]
                row.setdefault("burst events/s", []).append(burst.events_per_s)
                row.setdefault("burst CPU us/ev", []).append(burst.proxy_cpu_s / burst.events * 1e6)
    print(f"{'':16}{'this':>10}{'other':>10}{'this/other':>12}")
    for key in rows["this"]:
        a, b = (statistics.median(rows[n][key]) for n in ("this", "other"))
        print(f"{key:16}{a:10.2f}{b:10.2f}{a / b:11.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
