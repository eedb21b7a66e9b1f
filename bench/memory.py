"""troupe's memory estimate against llama-server's own buffer sizes, model by model.

Runs the real engine once per model with ``-lv 4``, reads the model, KV, compute and
output buffer sizes it logs, and prints them beside troupe's estimate with the error.

    .venv/bin/python bench/memory.py [--ctx N] [extra GGUF files...]

Uses the suite's tiny models in three shapes, plus the demo model (models/) if present.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import trio

from troupe.catalog import build_catalog
from troupe.catalog.facts import FactsCache
from troupe.catalog.memory import model_need
from troupe.child.breakdown import parse_buffer_line
from troupe.engine import find_engine
from troupe.settings.argv import parse_engine_args
from troupe.settings.options import load_option_table
from troupe.settings.router import build_settings, with_router_options
from troupe.testing import TinyModel, open_engine, write_tiny_gguf

SHAPES = (
    TinyModel(name="tiny-4x128"),
    TinyModel(
        name="tiny-8x256", n_layer=8, n_embd=256, n_head=8, n_head_kv=4, n_ff=1024, n_ctx=1024
    ),
    TinyModel(
        name="tiny-16x512", n_layer=16, n_embd=512, n_head=8, n_head_kv=4, n_ff=2048, n_ctx=1024
    ),
)
MiB = 1 << 20


async def reported(engine: Path, model: Path, args: list[str]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    argv = [str(engine), "-m", str(model), "--port", "0", "-lv", "4", *args]
    async with open_engine(argv, child=False) as proc:
        await proc.wait_log(r"compute buffer size")
        for line in proc.stderr_lines:
            parsed = parse_buffer_line(line)
            if parsed is not None:
                sizes[parsed.kind] = sizes.get(parsed.kind, 0) + parsed.bytes
    return sizes


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ctx", type=int, default=2048)
    parser.add_argument("models", nargs="*", type=Path)
    ns = parser.parse_args()
    engine, _ = find_engine()
    table = with_router_options(load_option_table(engine))
    args = ["-c", str(ns.ctx), "-np", "1"]
    with tempfile.TemporaryDirectory() as tmp:
        files = [write_tiny_gguf(Path(tmp) / f"{s.name}.gguf", s) for s in SHAPES]
        demo = Path("models/gemma-3-270m-q4_k_m.gguf")
        files += ([demo] if demo.is_file() else []) + list(ns.models)  # noqa: ASYNC240
        print(f"context {ns.ctx}, one slot; MiB")
        head = f"{'model':28} {'engine':>9} {'troupe':>9} {'error':>7}"
        print(head + "   (model + KV + compute + output)")
        worst = 0.0
        for path in files:
            sizes = await reported(engine, path, args)
            settings = build_settings(
                table, parse_engine_args(["--models-dir", str(path.parent), *args], table), {}, {}
            )
            entry = build_catalog(settings, table, {}, Path.cwd()).get(
                path.name.removesuffix(".gguf")
            )
            need = model_need(entry, FactsCache()) if entry else None
            truth = sum(sizes.values())
            if not need or not truth:
                print(f"{path.name:28} could not compare (engine {sizes}, troupe {need})")
                continue
            error = (need["host"] - truth) / truth
            worst = max(worst, abs(error))
            parts = " + ".join(
                f"{sizes.get(k, 0) / MiB:.1f}" for k in ("model", "context", "compute", "output")
            )
            row = f"{path.name:28} {truth / MiB:9.1f} {need['host'] / MiB:9.1f} {error:+7.1%}"
            print(f"{row}   ({parts})")
        print(f"worst error: {worst:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(trio.run(main))
