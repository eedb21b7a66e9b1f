"""Run scenarios against troupe and/or llama.cpp's router; check invariants; print results.

Each scenario gets a fresh router on its own preset. Before it: one completion of the
healthy model, every model unloaded, then the baseline (descriptors, RSS). After it:
the ledger (nothing hung, nothing answered twice), ``/health`` and a real completion,
every model unloaded, troupe's in-flight facts, leftovers, descriptors and RSS; then
SIGTERM, and nothing of the router may outlive it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import trio

from chaos import invariants as inv
from chaos.report import print_line, print_side_by_side, print_totals
from chaos.routers import CPP, TROUPE, Router
from chaos.scenario import TINY, Ctx, Scenario, seconds
from chaos.scenarios import SCENARIOS
from troupe.engine import find_engine
from troupe_rig import TinyModel, write_mixed_engine, write_tiny_models

PASS, FAIL, NA = "PASS", "FAIL", "n/a"
SLOW = TinyModel(name="slow", n_embd=512, n_ff=2048, n_layer=8, n_head=8, n_head_kv=8)


@dataclass
class Result:
    scenario: str
    router: str
    verdict: str
    seconds: float = 0.0
    figures: dict[str, str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


@dataclass
class Env:
    engine: Path
    mixed: Path
    models_dir: Path
    tmp: Path
    quick: bool
    troupe_flags: frozenset[str]
    run_id: str


def troupe_flags() -> frozenset[str]:
    """The flags ``troupe serve --help`` lists (``--load-timeout`` may be new)."""
    done = subprocess.run(
        [sys.executable, "-m", "troupe", "serve", "--help"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    return frozenset(w.rstrip(",=") for w in done.stdout.split() if w.startswith("--"))


async def run_one(env: Env, sc: Scenario, kind: str) -> Result:
    if kind == CPP and sc.needs_fake:
        return Result(sc.name, kind, NA, failures=["needs the fake engine (the C++ router "
                                                   "only spawns its own binary)"])  # fmt: skip
    workdir = env.tmp / f"{kind}-{sc.name}"
    workdir.mkdir(parents=True)
    (workdir / "hf-cache").mkdir()
    tag = f"{env.run_id}-{kind}-{sc.name}"
    ctx = Ctx(None, env.quick, env.models_dir, workdir, env.troupe_flags)  # type: ignore[arg-type]
    launch = sc.launch(ctx)
    launch.env.setdefault("LLAMA_CACHE", str(workdir / "hf-cache"))
    router = Router(kind, launch, engine=env.engine, mixed=env.mixed, workdir=workdir, tag=tag)
    ctx.router = router
    t0 = time.monotonic()

    def phase(name: str) -> None:
        if os.environ.get("CHAOS_DEBUG"):
            print(f"  [{sc.name}] {name} at {time.monotonic() - t0:.2f}s", file=sys.stderr)

    base = inv.Baseline(0, 0)
    try:
        if not sc.starts_router:
            await trio.to_thread.run_sync(router.start)
            phase("listening")
            base = await warm_up(ctx)
            phase("warm")
        cap_s = sc.cap_s[0] if env.quick else sc.cap_s[1]
        with trio.move_on_after(cap_s) as cap:
            await sc.run(ctx)
        if cap.cancelled_caught:
            ctx.fail(f"the scenario did not finish within {cap_s:g} s")
        phase("scenario done")
        ctx.failures += ctx.ledger.never()
        if sc.starts_router:
            pass  # its own checks
        elif ctx.checks_router and router.alive():
            if ctx.rebaseline:
                base = await warm_up(ctx)
            await after(ctx, base)
        elif ctx.checks_router:
            assert router.proc is not None
            ctx.fail(f"the router died (exit {router.proc.popen.returncode}): "
                     f"{router.log_tail(3)[-160:]}")  # fmt: skip
    except Exception as exc:
        ctx.fail(f"harness error: {type(exc).__name__}: {exc}"[:300])
        if os.environ.get("CHAOS_DEBUG"):
            traceback.print_exc()
    finally:
        phase("checked")
        if router.proc is not None and router.alive():
            took = await trio.to_thread.run_sync(router.terminate, 30.0)
            if took is None:
                ctx.fail("did not exit within 30 s of SIGTERM")
            ctx.failures += inv.orphans_after_exit(router)
        await trio.to_thread.run_sync(router.close)
        phase("closed")
    verdict = FAIL if ctx.failures else PASS
    return Result(sc.name, kind, verdict, time.monotonic() - t0, ctx.figures, ctx.failures)


async def warm_up(ctx: Ctx) -> inv.Baseline:
    """Load and unload the healthy model once, then measure the router at rest."""
    got = await ctx.client.completion(ctx.healthy, bound=60)
    if got.kind != "ok":
        raise RuntimeError(f"warm-up completion: {got.brief()} {got.error_message()[:80]}")
    left = await ctx.router.unload_all(30)
    if left:
        raise RuntimeError(f"warm-up: could not unload {left}")
    await trio.sleep(0.3)
    base = inv.baseline(ctx.router)
    ctx.fig("fds", base.fds)
    return base


async def after(ctx: Ctx, base: inv.Baseline) -> None:
    router = ctx.router
    ctx.failures += await inv.serving(router, ctx.healthy, bound=20 if ctx.quick else 30)
    left = await router.unload_all(30)
    if left:
        ctx.fail(f"could not unload {left} within 30 s")
    models = await router.models()
    ctx.failures += inv.troupe_facts(models)
    await trio.sleep(0.2)
    ctx.failures += inv.leftovers(router)
    fds = await inv.settle_fds(router, base, within=6)
    rss = router.rss()
    ctx.figures["fds"] = f"{base.fds}->{fds}"
    if ctx.rss_base is not None:  # the scenario's own reference (a second round)
        ctx.fig("rss-first", f"{inv.mib(base.rss):.0f}MiB")
        base = inv.Baseline(base.fds, ctx.rss_base)
    ctx.fig("rss", f"{inv.mib(base.rss):.0f}->{inv.mib(rss):.0f}MiB")
    ctx.failures += inv.resources(base, fds, rss)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    names = [s.name for s in SCENARIOS]
    ap = argparse.ArgumentParser(
        prog="bench/chaos/run.py",
        description="Faults from outside (signals, disconnects, raw bytes) and from the fake "
        "engine, against a real router; invariants checked after every scenario.",
        epilog="scenarios: " + ", ".join(names),
    )
    ap.add_argument("scenarios", nargs="*", metavar="SCENARIO", help="default: all")
    ap.add_argument("--quick", action="store_true", help="the CI subset, smaller sizes")
    ap.add_argument("--router", choices=[TROUPE, CPP, "both"], default=TROUPE)
    ap.add_argument("--engine", help="llama-server binary (default: troupe's find_engine)")
    ap.add_argument("--keep", action="store_true", help="keep the logs (temporary directory)")
    args = ap.parse_args(argv)
    unknown = [n for n in args.scenarios if n not in names]
    if unknown:
        ap.error(f"unknown scenario(s): {', '.join(unknown)} (known: {', '.join(names)})")
    return args


def select(args: argparse.Namespace) -> list[Scenario]:
    if args.scenarios:
        return [s for s in SCENARIOS if s.name in args.scenarios]
    return [s for s in SCENARIOS if s.quick or not args.quick]


async def run_all(env: Env, scenarios: list[Scenario], kinds: list[str]) -> list[Result]:
    results = []
    for sc in scenarios:
        for kind in kinds:
            result = await run_one(env, sc, kind)
            results.append(result)
            print_line(result, prefix=len(kinds) > 1)
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    kinds = [TROUPE, CPP] if args.router == "both" else [args.router]
    engine = find_engine(args.engine)[0]
    tmp = Path(tempfile.mkdtemp(prefix="troupe-chaos-"))
    try:
        models = tmp / "models"
        write_tiny_models(models, [*(TinyModel(name=n) for n in TINY), SLOW])
        env = Env(engine, write_mixed_engine(tmp / "engine", engine), models, tmp, args.quick,
                  troupe_flags() if TROUPE in kinds else frozenset(),
                  f"{os.getpid()}-{int(time.time())}")  # fmt: skip
        scenarios = select(args)
        print(f"chaos: {len(scenarios)} scenarios against {', '.join(kinds)}"
              f"{' (quick)' if args.quick else ''}; engine {engine}", flush=True)  # fmt: skip
        t0 = time.monotonic()
        results = trio.run(run_all, env, scenarios, kinds)
    except KeyboardInterrupt:
        print("\ninterrupted; every process the harness started is stopped", file=sys.stderr)
        return 130
    finally:
        if args.keep or os.environ.get("CHAOS_KEEP"):
            print(f"logs kept in {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    if len(kinds) > 1:
        print_side_by_side(results, kinds)
    print(f"({seconds(time.monotonic() - t0)} in all)")
    return print_totals(results)
