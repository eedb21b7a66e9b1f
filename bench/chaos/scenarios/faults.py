"""Children that fail: killed or stopped while loading (from outside, real engine), and
what only the fake engine can do on demand (crash at token N, an OOM line, an ignored
exit command, an ignored SIGTERM)."""

from __future__ import annotations

import signal
from functools import partial

import trio

from chaos.client import ERROR, OK, STREAM_ERROR
from chaos.procs import wait_gone
from chaos.scenario import Ctx, Scenario, preset_launch, seconds, until_ok

BYSTANDER = "m1"


async def _traffic(ctx: Ctx, group: str, model: str, until: trio.Event, bound: float) -> None:
    """Back-to-back requests for ``model`` until ``until`` is set (at least one)."""
    while True:
        await ctx.request(group, model, bound)
        if until.is_set():
            return


async def _catch_loading(ctx: Ctx, model: str, sig: int, group: str, n: int, bound: float) -> float:
    """Send ``n`` requests for cold ``model`` and ``sig`` its child the moment it starts;
    returns how long after it appeared the signal went (s), or -1 if it never did."""
    caught: list[tuple[int, float] | None] = []

    async def catcher() -> None:
        caught.append(await ctx.catch(model, sig, within=bound))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(catcher)
        await trio.sleep(0.05)  # the catcher is polling before the load is asked for
        for _ in range(n):
            nursery.start_soon(partial(ctx.request, group, model, bound))
    got = caught[0] if caught else None
    if got is None:
        ctx.fail(f"{model}: no child appeared to catch")
        return -1.0
    return got[1]


async def crash_in_load(ctx: Ctx) -> None:
    """SIGKILL a child mid-load: its waiters get an error or a retried load, never a
    hang; the bystander model is never disturbed; the victim loads again afterwards."""
    done = trio.Event()
    bound = 30.0
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_traffic, ctx, "bystander", BYSTANDER, done, bound)
        after = await _catch_loading(ctx, "m2", signal.SIGKILL, "victim", 4, bound)
        done.set()
    ctx.fig("killed", f"{after * 1000:.0f}ms-after-exec")
    ctx.fig("victim", ctx.ledger.summary("victim"))
    ctx.fig("bystander", ctx.ledger.summary("bystander"))
    ctx.require("victim", OK, ERROR)
    ctx.require("bystander", OK)
    again = await until_ok(ctx, "victim-after", "m2", bound)
    ctx.fig("reload", seconds(again.elapsed))


async def hang_in_load(ctx: Ctx) -> None:
    """SIGSTOP a child mid-load (it never becomes ready and says nothing): another model
    that fits must load and serve meanwhile; the hung load's waiters get a clear error
    within the bound (troupe: --load-timeout); the model can be loaded again after."""
    timeout = 5.0 if "--load-timeout" in ctx.troupe_flags and ctx.is_troupe else None
    bound = (timeout or 5.0) + 10.0
    stopped: list[int] = []
    caught = trio.Event()

    async def stop_it() -> None:
        got = await ctx.catch("m2", signal.SIGSTOP, within=bound)
        if got is not None:
            stopped.append(got[0])
        caught.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop_it)
        await trio.sleep(0.05)
        for _ in range(2):
            nursery.start_soon(partial(ctx.request, "hung", "m2", bound))
        await caught.wait()
        await trio.sleep(0.3)  # the child is stopped; the router still waits on it
        other = await ctx.request("other-model", BYSTANDER, 10.0)  # a cold load: ~10 ms
        ctx.fig("other-model", f"{other.brief()}@{seconds(other.elapsed)}")
    if not stopped:
        ctx.fail("m2: no child appeared to stop")
        return
    ctx.fig("hung-waiters", ctx.ledger.summary("hung"))
    ctx.fig("load-timeout", f"{timeout:g}s" if timeout else "none")
    ctx.require("other-model", OK)
    ctx.require("hung", ERROR, OK)
    if any(a.kind == "hung" for a in ctx.ledger.group("hung")):
        return  # nothing ended the hung load: asking for it again would only wait too
    again = await ctx.request("victim-after", "m2", bound)
    ctx.require("victim-after", OK)
    ctx.fig("reload", f"{again.brief()}@{seconds(again.elapsed)}")


async def crash_mid_stream(ctx: Ctx) -> None:
    """The fake dies after 6 tokens: each stream ends with an error event (or a clean
    error if nothing was sent yet), others are unaffected, and the model serves again."""
    done = trio.Event()
    async with trio.open_nursery() as outer:
        outer.start_soon(_traffic, ctx, "bystander", BYSTANDER, done, 30)
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(partial(ctx.request, "stream", "crashy", 30, n=32, stream=True))
            nursery.start_soon(partial(ctx.request, "plain", "crashy", 30, n=32))
        done.set()
    ctx.fig("streams", ctx.ledger.summary("stream"))
    ctx.fig("plain", ctx.ledger.summary("plain"))
    ctx.fig("bystander", ctx.ledger.summary("bystander"))
    cut = [a for a in ctx.ledger.group("stream") if a.kind == "truncated"]
    if cut:
        ctx.fail(f"{len(cut)} streams cut without an error event")
    ctx.require("stream", STREAM_ERROR, ERROR)
    ctx.require("plain", ERROR)
    ctx.require("bystander", OK)
    again = await until_ok(ctx, "after", "crashy", 30)  # 4 tokens < the crash at 6
    ctx.fig("reload", seconds(again.elapsed))


async def _swap_away(ctx: Ctx, stubborn: str, ladder: float) -> None:
    """Load ``stubborn``, then ask for another model at --models-max 1: the other model
    must be served, and the stop ladder must get rid of ``stubborn`` within its bound
    (``ladder``: stop-timeout + term-grace). The C++ router serves the other model once
    the stubborn one is gone; troupe, where memory has room for both, at once beside it."""
    await until_ok(ctx, "stubborn", stubborn, 30)
    pid = ctx.live_child(stubborn)
    swap = await until_ok(ctx, "swap", BYSTANDER, 40)
    ctx.fig("swap", seconds(swap.elapsed))
    if pid is None:
        ctx.fail(f"no child of {stubborn} seen")
    elif not await wait_gone(pid, ladder + 5.0):
        ctx.fail(f"{stubborn} (pid {pid}) still running {ladder + 5.0:g} s after the swap")


async def ignored_exit(ctx: Ctx) -> None:
    await _swap_away(ctx, "deaf", 2.0)


async def ignored_sigterm(ctx: Ctx) -> None:
    await _swap_away(ctx, "stubborn", 2.0)
    await until_ok(ctx, "again", "stubborn", 30)  # left loaded: the final unload must stop it


async def oom_line(ctx: Ctx) -> None:
    """A child that prints a CUDA OOM line and exits while loading: its waiters get a clear
    error (not a hang, not a crash loop), other models serve throughout."""
    done = trio.Event()
    async with trio.open_nursery() as outer:
        outer.start_soon(_traffic, ctx, "bystander", BYSTANDER, done, 30)
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(partial(ctx.request, "oom", "oomy", 30))
        for _ in range(2):
            await ctx.request("oom-again", "oomy", 30)
        done.set()
    answers = ctx.ledger.group("oom") + ctx.ledger.group("oom-again")
    ctx.fig("oom", ctx.ledger.summary("oom") + "+" + ctx.ledger.summary("oom-again"))
    ctx.fig("worst", seconds(max((a.elapsed for a in answers), default=0)))
    message = next((a.error_message() for a in answers if a.kind == ERROR), "")
    ctx.fig("says", repr(message[:50]))
    ctx.fig("spawns", len(ctx.children_for("oomy")))
    ctx.require("oom", ERROR)
    ctx.require("oom-again", ERROR)
    ctx.require("bystander", OK)
    if message and "memory" not in message.lower():
        ctx.fail(f"the error does not say out of memory: {message[:80]!r}")


SCENARIOS = [
    Scenario("crash-in-load", "SIGKILL a child mid-load", preset_launch(
        {"m1": {}, "m2": {}}, 2), crash_in_load),
    Scenario("hang-in-load", "SIGSTOP a child mid-load", preset_launch(
        {"m1": {}, "m2": {}}, 2, troupe_extra=lambda ctx: (
            ("--load-timeout", "5") if "--load-timeout" in ctx.troupe_flags else ())),
        hang_in_load),
    Scenario("crash-mid-stream", "the fake dies at token 6", preset_launch(
        {"m1": {}, "crashy": {"copy": "m2", "fake-crash-after": "6", "fake-tps": "40"}}, 2),
        crash_mid_stream, needs_fake=True),
    Scenario("ignored-exit", "the fake ignores the exit command", preset_launch(
        {"m1": {}, "deaf": {"copy": "m2", "fake-ignore-exit": "on", "stop-timeout": "2"}}, 1),
        ignored_exit, needs_fake=True, quick=False),  # ignored-sigterm ignores it too
    Scenario("ignored-sigterm", "exit command and SIGTERM ignored", preset_launch(
        {"m1": {}, "stubborn": {"copy": "m2", "fake-ignore-exit": "on",
                                "fake-ignore-sigterm": "on", "stop-timeout": "1",
                                "term-grace": "1"}}, 1),
        ignored_sigterm, needs_fake=True),
    Scenario("oom-line", "the fake prints a CUDA OOM line", preset_launch(
        {"m1": {}, "oomy": {"copy": "m2", "fake-oom": "on"}}, 2), oom_line, needs_fake=True),
]  # fmt: skip
