"""Catalog changes whose client gives up: a reload while a changed model is slow to stop,
and a removal (``DELETE /models``) of a Hugging Face cache model that is slow to stop.
The child is made slow from outside (SIGSTOP): only the stop ladder's SIGKILL ends it."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import trio

from chaos.client import DROPPED, OK, Drop
from chaos.scenario import Ctx, Scenario, preset_launch, seconds, until_ok, write_preset
from troupe_rig import TinyModel, write_tiny_gguf

STOP_TIMEOUT = "3"
RELOAD_MODELS = {"m1": {}, "m2": {}, "m3": {"stop-timeout": STOP_TIMEOUT}}


async def abandoned_reload(ctx: Ctx) -> None:
    """m3 loaded and stopped (SIGSTOP); its preset changes; ``GET /models?reload=1`` is
    dropped after 1 s. Afterwards a cold load of another model must still work, and m3
    must come back with its new preset."""
    await until_ok(ctx, "before", "m3", 30)
    old_args = (await ctx.router.models())["m3"]["status"]["args"]
    pid = ctx.signal_model("m3", signal.SIGSTOP)
    if pid is None:
        ctx.fail("m3: no child to stop")
        return
    changed = {**RELOAD_MODELS, "m3": {**RELOAD_MODELS["m3"], "temp": "0.5"}}
    write_preset(ctx.workdir / "preset.ini", changed, ctx.models_dir)
    got = await ctx.client.call("GET", "/models?reload=1", bound=10, drop=Drop(after_s=1.0))
    ctx.ledger.add("reload", got)
    ctx.fig("reload", got.brief())
    if got.kind != DROPPED:
        ctx.fig("reload-took", seconds(got.elapsed))
    cold = await ctx.request("cold-load", "m2", 15)  # m3's ladder ends in ~8 s
    ctx.fig("cold-load-after", f"{cold.brief()}@{seconds(cold.elapsed)}")
    ctx.require("cold-load", OK)
    if cold.kind != OK:
        return  # wedged: every further load would wait out its bound too
    back = await ctx.request("changed", "m3", 30)
    ctx.require("changed", OK)
    ctx.fig("m3-after", f"{back.brief()}@{seconds(back.elapsed)}")
    if back.kind == OK and (await ctx.router.models())["m3"]["status"]["args"] == old_args:
        ctx.fail("m3 runs with its old preset after the reload")


COMMIT = "0123456789abcdef0123456789abcdef01234567"
CACHED = "org/repo:Q8_0"


def hf_cache(root: Path) -> Path:
    """models--org--repo with Q4_K_M and Q8_0 files, snapshot links to blobs."""
    repo = root / "models--org--repo"
    snapshot = repo / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    (repo / "blobs").mkdir()
    for i, tag in enumerate(("Q4_K_M", "Q8_0")):
        write_tiny_gguf(repo / "blobs" / f"oid{i}", TinyModel(name=tag, seed=i))
        os.symlink(f"../../blobs/oid{i}", snapshot / f"model-{tag}.gguf")
    return repo


def _cache_env(ctx: Ctx) -> dict[str, str]:
    root = ctx.workdir / "hub"
    hf_cache(root)
    return {"LLAMA_CACHE": str(root)}


async def abandoned_delete(ctx: Ctx) -> None:
    """A loaded cache model is stopped (SIGSTOP) and ``DELETE /models`` for it is dropped
    after 1 s. Cold loads must keep working, and the removal must complete: the entry
    and its files gone, the other tag's file kept."""
    repo = ctx.workdir / "hub" / "models--org--repo"
    await until_ok(ctx, "before", CACHED, 30)
    ctx.router.tracker.sample()
    q8 = next((s.pid for s in ctx.router.tracker.survivors()
               if "models--org--repo" in s.cmd or "org/repo" in s.cmd), None)  # fmt: skip
    if q8 is None:
        ctx.fail(f"{CACHED}: no child to stop")
        return
    os.kill(q8, signal.SIGSTOP)
    got = await ctx.client.call(
        "DELETE", f"/models?model={CACHED}", bound=10, drop=Drop(after_s=1.0)
    )
    ctx.ledger.add("delete", got)
    ctx.fig("delete", got.brief())
    cold = await ctx.request("cold-load", "m2", 15)
    ctx.fig("cold-load-after", f"{cold.brief()}@{seconds(cold.elapsed)}")
    ctx.require("cold-load", OK)
    t0 = time.monotonic()
    gone = False
    with trio.move_on_after(15):
        while not gone:
            listed = CACHED in await ctx.router.models()
            files = (repo / "blobs" / "oid1").exists()
            gone = not listed and not files
            if not gone:
                await trio.sleep(0.2)
    listed = CACHED in await ctx.router.models()
    files = (repo / "blobs" / "oid1").exists()
    ctx.fig("removed", seconds(time.monotonic() - t0) if gone else "no")
    if not gone:
        state = f"listed={listed} file={files}"
        ctx.fail(f"the abandoned removal did not complete within 15 s ({state})")
    if not (repo / "blobs" / "oid0").exists():
        ctx.fail("the other tag's file was deleted too")


SCENARIOS = [
    Scenario("abandoned-reload", "reload dropped while a changed model is stuck", preset_launch(
        RELOAD_MODELS, 3), abandoned_reload),
    Scenario("abandoned-delete", "DELETE /models dropped while the model is stuck", preset_launch(
        {"*": {"stop-timeout": STOP_TIMEOUT}, "m1": {}, "m2": {}}, 3, extra=("--offline",),
        env=_cache_env),
        abandoned_delete),
]  # fmt: skip
