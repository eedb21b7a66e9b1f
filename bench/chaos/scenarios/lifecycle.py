"""The router itself: SIGKILLed and restarted (its children must not outlive it), and
SIGTERMed with loads and streams in flight (a bounded, clean stop)."""

from __future__ import annotations

import signal
import time
from functools import partial

import trio

from chaos import invariants as inv
from chaos.client import ERROR, OK
from chaos.procs import describe
from chaos.scenario import Ctx, Scenario, preset_launch, seconds, until_ok


async def _wait_gone(pids: list[tuple[int, float | None]], within: float) -> list[int]:
    """The pids still alive after ``within`` seconds (or as soon as none are)."""
    with trio.move_on_after(within):
        while inv.still_alive(pids):  # noqa: ASYNC110 (other processes: nothing to wait on)
            await trio.sleep(0.02)
    return inv.still_alive(pids)


async def router_sigkill(ctx: Ctx) -> None:
    """SIGKILL the router with two models loaded, a stream in flight and a third model's
    child stopped mid-load. Loaded children must exit on stdin EOF; the stopped one can
    only be reaped by the next router at start-up (troupe: its PID ledger)."""
    router = ctx.router
    await until_ok(ctx, "before", "m1", 30)
    await until_ok(ctx, "before", "m2", 30)
    first = router.pid
    stopped: list[int] = []
    caught = trio.Event()
    async with trio.open_nursery() as nursery:

        async def stop_m3() -> None:
            got = await ctx.catch("m3", signal.SIGSTOP, within=10)
            if got is not None:
                stopped.append(got[0])
            caught.set()

        nursery.start_soon(stop_m3)
        await trio.sleep(0.05)
        nursery.start_soon(partial(ctx.request, "cut", "m3", 10))
        nursery.start_soon(partial(ctx.request, "cut", "m1", 10, n=200, stream=True))
        await caught.wait()
        await trio.sleep(0.05)
        await trio.to_thread.run_sync(router.sigkill)
    children = [(s.pid, s.created) for s in router.tracker.all() if s.parent_root == first]
    t0 = time.monotonic()
    loaded = [(p, c) for p, c in children if p not in stopped]
    left = await _wait_gone(loaded, 5.0)
    ctx.fig("children", len(children))
    ctx.fig("eof-exit", seconds(time.monotonic() - t0) if not left else "no")
    if left:
        ctx.fail(f"alive 5 s after the router was SIGKILLed: {describe(left)}")
    if not stopped:
        ctx.fail("m3: no child appeared to stop")
    await trio.to_thread.run_sync(router.start)
    t0 = time.monotonic()
    left = await _wait_gone(children, 5.0)
    ctx.fig("reaped-at-restart", seconds(time.monotonic() - t0) if not left else "no")
    if left:
        ctx.fail(f"not reaped by the restarted router within 5 s: {describe(left)}")
    ctx.rebaseline = True
    again = await until_ok(ctx, "after-restart", "m3", 30)
    ctx.fig("m3-after-restart", seconds(again.elapsed))


async def sigterm_drain(ctx: Ctx) -> None:
    """SIGTERM with streams in flight and two cold loads pending: the router exits within
    a bound, every stream finishes or ends with an error event, every waiter gets an
    answer, exit status 0, and no child outlives it."""
    ctx.checks_router = False
    router = ctx.router
    await until_ok(ctx, "warm", "slow", 60)
    n = 2  # two streams of 110 tokens fill the shared 256-token context
    started = [trio.Event() for _ in range(n)]
    took: list[float | None] = []
    async with trio.open_nursery() as nursery:
        for ev in started:
            nursery.start_soon(
                partial(ctx.request, "stream", "slow", 60, n=110, stream=True, started=ev)
            )
        with trio.move_on_after(20):
            for ev in started:
                await ev.wait()
        for model in ("m2", "m3"):
            nursery.start_soon(partial(ctx.request, "pending-load", model, 30))
        await trio.sleep(0.005)
        took.append(await trio.to_thread.run_sync(router.terminate, 30.0))
    exited = took[0]
    ctx.fig("sigterm-exit", seconds(exited) if exited is not None else ">30s")
    ctx.fig("exit-code", router.exit_code)
    ctx.fig("streams", ctx.ledger.summary("stream"))
    ctx.fig("pending", ctx.ledger.summary("pending-load"))
    if exited is None:
        ctx.fail("still running 30 s after SIGTERM")
    elif router.exit_code != 0:
        ctx.fail(f"exit status {router.exit_code} after SIGTERM")
    ctx.require("stream", OK)  # a second of tokens left: a drain lets them finish
    ctx.require("pending-load", OK, ERROR)
    ctx.failures += inv.orphans_after_exit(router)


async def startup_failure(ctx: Ctx) -> None:
    """More ``load-on-startup`` models than ``--models-max`` (upstream: "number of models to
    load on startup exceeds models_max", exit 1): the router exits non-zero within a
    bound, says why in one line (no traceback), and leaves nothing behind. (A child
    that fails to load later is not a start-up failure upstream: the router serves on.)"""
    router = ctx.router
    t0 = time.monotonic()
    await trio.to_thread.run_sync(router.spawn)
    code = await trio.to_thread.run_sync(router.wait_exit, 30.0)
    ctx.fig("exit", f"{code}@{seconds(time.monotonic() - t0)}" if code is not None else "no")
    text = router.proc.log.read_text(errors="replace") if router.proc else ""
    last = next((ln.strip() for ln in reversed(text.splitlines()) if ln.strip()), "")
    ctx.fig("says", repr(last[-70:]))
    if code is None:
        ctx.fail("still running 30 s after a start-up that cannot succeed")
    elif code == 0:
        ctx.fail("exit status 0 after a start-up that cannot succeed")
    if "Traceback (most recent call last)" in text:
        ctx.fail(f"a traceback instead of a one-line error: {last[-100:]!r}")
    ctx.failures += inv.orphans_after_exit(router)


SCENARIOS = [
    Scenario("router-sigkill", "SIGKILL the router, then restart it", preset_launch(
        {"m1": {}, "m2": {}, "m3": {}}, 3), router_sigkill),
    Scenario("sigterm-drain", "SIGTERM with streams and loads in flight", preset_launch(
        {"m1": {}, "m2": {}, "m3": {}, "slow": {}}, 4), sigterm_drain),
    Scenario("startup-failure", "more load-on-startup models than slots", preset_launch(
        {"m1": {"load-on-startup": "true"}, "m2": {"load-on-startup": "true"}}, 1),
        startup_failure, starts_router=True),
]  # fmt: skip
