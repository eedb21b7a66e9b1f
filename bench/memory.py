"""What a model takes, three ways, against what the child says it holds once loaded.

For each model and context it runs, with the real engine and the same arguments:

* troupe's **header estimate** (the GGUF header: weights, KV cache, compute and output
  buffers; what admission falls back on);
* the **engine's projection** (troupe's measurement job: ``--fit``'s breakdown, read
  before any weight is loaded, the child's exact arguments);
* the child's **own breakdown after load** (``-lv 4``, printed at exit: model + context +
  compute per device) and its **RSS** once up (what troupe trues the ledger up with);

and prints them side by side with the error of each against the breakdown after load.

    .venv/bin/python bench/memory.py [--ctx N ...] [extra GGUF files...]

Uses three tiny shapes the bench writes, plus the demo model (Gemma 3 270M) when its
package is installed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import trio

from troupe.actors.measure import MeasureJob
from troupe.catalog import build_catalog
from troupe.catalog.facts import FactsCache
from troupe.catalog.memory import model_need
from troupe.engine import find_engine
from troupe.messages import Measured, Message
from troupe.settings.argv import parse_engine_args
from troupe.settings.options import OptionTable, load_option_table
from troupe.settings.router import build_settings, with_router_options
from troupe_rig import TinyModel, write_tiny_gguf
from troupe_rig.checks import loaded_breakdown

SHAPES = (
    TinyModel(name="tiny-4x128", n_ctx=4096),
    TinyModel(
        name="tiny-8x256", n_layer=8, n_embd=256, n_head=8, n_head_kv=4, n_ff=1024, n_ctx=4096
    ),
    TinyModel(
        name="tiny-16x512", n_layer=16, n_embd=512, n_head=8, n_head_kv=4, n_ff=2048, n_ctx=4096
    ),
)
MiB = 1 << 20


def estimate(table: OptionTable, path: Path, args: list[str]) -> int | None:
    """troupe's header estimate, through the catalog exactly as the router builds it."""
    settings = build_settings(
        table, parse_engine_args(["--models-dir", str(path.parent), *args], table), {}, {}
    )
    entry = build_catalog(settings, table, {}, Path.cwd()).get(path.name.removesuffix(".gguf"))
    need = model_need(entry, FactsCache()) if entry else None
    return need.get("host") if need else None


async def projection(argv: list[str]) -> int | None:
    send, recv = trio.open_memory_channel[Message](1)
    await MeasureJob("bench", "fp", argv, {}, send).run()
    result = await recv.receive()
    return result.need.get("host") if isinstance(result, Measured) else None


async def after_load(argv: list[str]) -> tuple[int, int]:
    """The child's own breakdown (host) and its RSS, once loaded."""
    breakdown, rss = await loaded_breakdown(argv)
    return breakdown.get("host", 0), rss


def cell(value: int | None, truth: int) -> str:
    if not value:
        return f"{'-':>9} {'':>7}"
    return f"{value / MiB:9.1f} {(value - truth) / truth:+7.1%}"


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ctx", type=int, nargs="*", default=[512, 2048, 4096])
    parser.add_argument("models", nargs="*", type=Path)
    ns = parser.parse_args()
    engine, _ = find_engine()
    table = with_router_options(load_option_table(engine))
    worst = {"estimate": 0.0, "engine": 0.0}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        files = [write_tiny_gguf(tmp / f"{s.name}.gguf", s) for s in SHAPES]
        try:
            from troupe.demo import assemble_demo_model  # noqa: PLC0415

            files.append(assemble_demo_model(tmp / "demo"))
        except SystemExit:
            print("(the demo model is not installed: tiny models only)")
        files += list(ns.models)
        print("one slot; host memory in MiB; errors against the child's own breakdown after load")
        print(
            f"{'model':28} {'ctx':>5} {'after load':>10} {'estimate':>9} {'error':>7}"
            f" {'engine':>9} {'error':>7} {'RSS':>9} {'error':>7}"
        )
        for path in files:
            for ctx in ns.ctx:
                args = ["-c", str(ctx), "-np", "1"]
                argv = [str(engine), "-m", str(path), "--port", "0", *args]
                truth, rss = await after_load(argv)
                if not truth:
                    print(f"{path.name:28} {ctx:5} the child printed no breakdown")
                    continue
                est = estimate(table, path, args)
                proj = await projection(argv)
                for key, value in (("estimate", est), ("engine", proj)):
                    if value:
                        worst[key] = max(worst[key], abs(value - truth) / truth)
                print(
                    f"{path.name:28} {ctx:5} {truth / MiB:10.1f} {cell(est, truth)}"
                    f" {cell(proj, truth)} {cell(rss, truth)}"
                )
        print(
            f"worst error: header estimate {worst['estimate']:.1%}, "
            f"engine projection {worst['engine']:.1%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(trio.run(main))
