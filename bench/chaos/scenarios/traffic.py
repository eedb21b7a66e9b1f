"""Clients: a storm of clients that give up at every await, a load storm over more models
than slots, swap churn at --models-max 1, and thousands of idle connections."""

from __future__ import annotations

import contextlib
import itertools
import random
import select
import socket
import time
from functools import partial

import trio

from chaos.client import DROPPED, OK, Drop
from chaos.invariants import mib
from chaos.scenario import TINY, Ctx, Scenario, preset_launch, seconds, write_preset

STORM_MODELS = ("m1", "m2", "m3")
SLOW_SWAP_S = 2.0  # twenty times what a swap of two tiny models takes
WITNESSED = ("m1", "m2")  # m3 is the one the storm unloads and reloads


async def _witnesses(ctx: Ctx, group: str, models: tuple[str, ...], until: trio.Event) -> None:
    """Plain clients that must all be served while the storm goes on."""
    i = 0
    while not until.is_set():
        await ctx.request(group, models[i % len(models)], 60)
        i += 1


def peer_spoke(fd: int) -> bool:
    """The router answered or closed this idle connection (without reading it away)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    if not poller.poll(0):
        return False
    sock = socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM)  # a dup: closing it is fine
    try:
        sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        return True
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.close()


def _toggle_preset(ctx: Ctx, n: int) -> None:
    """A changed preset for m3 every other reload, so a reload has a model to restart."""
    sections: dict[str, dict[str, str]] = {m: {} for m in STORM_MODELS}
    if n % 2:
        sections["m3"] = {"temp": "0.5"}
    write_preset(ctx.workdir / "preset.ini", sections, ctx.models_dir)


async def disconnect_storm(ctx: Ctx) -> None:
    """Clients that leave at every await: while sending, while queued or loading, after
    the head, mid-stream, with a conversation id (detached), mid-reload, mid-unload."""
    rng = random.Random(10)
    n = ctx.size(60, 300)
    done = trio.Event()
    modes = ["sending", "waiting", "head", "stream", "conversation", "reload", "unload"]

    limiter = trio.CapacityLimiter(24)

    async def one(i: int) -> None:
        async with limiter:
            await _one(i)

    async def _one(i: int) -> None:
        model = STORM_MODELS[i % len(STORM_MODELS)]
        mode = modes[i % len(modes)]
        delay = rng.uniform(0.0, 0.4)
        if mode == "sending":
            got = await ctx.client.completion(model, bound=10, drop=Drop(send_bytes=40))
        elif mode in ("waiting", "conversation"):
            headers = {"X-Conversation-Id": f"storm-{i}"} if mode == "conversation" else None
            got = await ctx.client.completion(
                model, bound=10, n=32, drop=Drop(after_s=delay), headers=headers
            )
        elif mode == "head":
            # 45 s: a busy child told to stop (a reload) takes the whole ladder, 15 s in
            # troupe: llama-server does not exit with requests in flight
            got = await ctx.client.completion(model, bound=45, drop=Drop(after_head=True))
        elif mode == "stream":
            got = await ctx.client.completion(
                model, bound=45, n=64, stream=True, drop=Drop(events=2)
            )
        elif mode == "reload":
            _toggle_preset(ctx, i)
            got = await ctx.client.call(
                "GET", "/models?reload=1", bound=10, drop=Drop(after_s=delay / 4)
            )
        else:
            model = "m3"  # an explicit unload fails the model's waiters, as upstream does
            got = await ctx.client.call(
                "POST", "/models/unload", {"model": model}, bound=10, drop=Drop(after_s=0.0)
            )
        ctx.ledger.add(f"drop-{mode}", got, model)

    async with trio.open_nursery() as outer:
        for _ in range(4):
            outer.start_soon(_witnesses, ctx, "witness", WITNESSED, done)
        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(one, i)
                await trio.sleep(rng.uniform(0, 0.02))
        done.set()
    dropped = sum(1 for r in ctx.ledger.records if r.group.startswith("drop-"))
    ctx.fig("clients", dropped)
    ctx.fig("left-early", sum(1 for r in ctx.ledger.records if r.answer.kind == DROPPED))
    ctx.fig("witness", ctx.ledger.summary("witness"))
    ctx.fig("witness-worst", seconds(ctx.ledger.worst_s("witness")))
    ctx.require("witness", OK)
    _toggle_preset(ctx, 0)


async def load_storm(ctx: Ctx) -> None:
    """Many concurrent requests over six models at --models-max 2: every one is served."""
    n = ctx.size(24, 96)
    rng = random.Random(7)
    async with trio.open_nursery() as nursery:
        for i in range(n):
            nursery.start_soon(partial(ctx.request, "storm", TINY[i % len(TINY)], 90))
            await trio.sleep(rng.uniform(0, 0.01))
    answers = ctx.ledger.group("storm")
    times = sorted(a.elapsed for a in answers if a.kind == OK)
    ctx.fig("requests", ctx.ledger.summary("storm"))
    if times:
        ctx.fig("p50", seconds(times[len(times) // 2]))
        ctx.fig("worst", seconds(times[-1]))
    ctx.fig("loads", sum(len(ctx.children_for(m)) for m in TINY))
    ctx.require("storm", OK)


async def swap_churn(ctx: Ctx) -> None:
    """At --models-max 1: first one client alternating two models (each request a swap),
    then 16 concurrent clients alternating until enough swaps happened. Every request
    served; descriptors sampled throughout."""
    seq = ctx.size(10, 30)
    for i in range(seq):
        await ctx.request("sequential", ("m1", "m2")[i % 2], 60)
    times = sorted(a.elapsed for a in ctx.ledger.group("sequential") if a.kind == OK)
    if times:
        ctx.fig("seq-swap-p50", seconds(times[len(times) // 2]))
        ctx.fig("seq-swap-worst", seconds(times[-1]))
    target = ctx.size(40, 200)
    start = len(ctx.children_for("m1")) + len(ctx.children_for("m2"))
    done = trio.Event()
    peak = [ctx.router.fds(), ctx.router.rss()]

    def swaps() -> int:
        ctx.router.tracker.sample()
        return len(ctx.children_for("m1")) + len(ctx.children_for("m2")) - start

    async def client(k: int) -> None:
        i = k
        while not done.is_set():
            await ctx.request("churn", ("m1", "m2")[i % 2], 60)
            i += 1

    t0 = time.monotonic()
    cap = ctx.size(30, 240)
    async with trio.open_nursery() as nursery:
        for k in range(16):
            nursery.start_soon(client, k)
        while swaps() < target and time.monotonic() - t0 < cap:
            peak = [max(peak[0], ctx.router.fds()), max(peak[1], ctx.router.rss())]
            await trio.sleep(0.2)
        done.set()
    count = swaps()
    if count < target:
        ctx.fail(f"only {count} swaps in {cap} s (wanted {target})")
    ctx.fig("swaps", f"{count}in{seconds(time.monotonic() - t0)}")
    ctx.fig("requests", ctx.ledger.summary("churn"))
    ctx.fig("churn-request-worst", seconds(ctx.ledger.worst_s("churn")))
    gap = _worst_gap(ctx, t0)
    ctx.fig("no-child-gap-worst", seconds(gap))
    worst_seq = times[-1] if times else 0.0
    if max(gap, worst_seq) > SLOW_SWAP_S:  # a tiny model swaps in ~0.1 s
        ctx.fail(f"a swap took {seconds(max(gap, worst_seq))} (over {SLOW_SWAP_S:g} s)")
    ctx.fig("fds-peak", peak[0])
    ctx.fig("fds-end", ctx.router.fds())
    ctx.fig("rss-peak", f"{mib(peak[1]):.0f}MiB")
    ctx.require("sequential", OK)
    ctx.require("churn", OK)


def _worst_gap(ctx: Ctx, since: float) -> float:
    """The longest time with no child alive (one's exit to the next one's start), as the
    tracker saw it (to its 10 ms sampling): what a swap costs at least."""
    kids = sorted((s for m in ("m1", "m2") for s in ctx.children_for(m)), key=lambda s: s.first)
    kids = [s for s in kids if s.last >= since]
    return max((b.first - a.last for a, b in itertools.pairwise(kids)), default=0.0)


async def idle_connections(ctx: Ctx) -> None:
    """Thousands of connections that say nothing (or half a request), held open while
    other clients must still be served; then closed, and the descriptors come back.
    Twice: RSS is compared with the end of the first round (an allocator keeps its high
    water mark; a leak grows again)."""
    n = ctx.size(1000, 2000)
    for round_ in (1, 2):
        await _idle_round(ctx, n, ctx.size(3, 10), last=round_ == 2)
        if round_ == 1:
            await trio.sleep(0.5)
            ctx.rss_base = ctx.router.rss()
    ctx.require("health", OK)
    ctx.require("completion", OK)


async def _idle_round(ctx: Ctx, n: int, hold: float, *, last: bool) -> None:
    streams: list[trio.SocketStream] = []
    partial = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    limiter = trio.CapacityLimiter(100)
    t0 = time.monotonic()

    async def connect(i: int) -> None:
        try:
            async with limiter:
                stream = await trio.open_tcp_stream(*ctx.client.address)
        except OSError:
            return
        streams.append(stream)
        if i % 2:
            with contextlib.suppress(OSError, trio.BrokenResourceError):
                await stream.send_all(partial)

    try:
        with trio.move_on_after(60):
            async with trio.open_nursery() as nursery:
                for i in range(n):
                    nursery.start_soon(connect, i)
        if last:
            ctx.fig("opened", f"{len(streams)}in{seconds(time.monotonic() - t0)}")
        if len(streams) < n:
            ctx.fail(f"only {len(streams)} of {n} connections could be opened")
        await trio.sleep(0.5)
        if last:
            ctx.fig("fds-held", ctx.router.fds())
        t_hold = time.monotonic()
        while time.monotonic() - t_hold < hold:
            ctx.ledger.add("health", await ctx.client.call("GET", "/health", bound=5))
            await ctx.request("completion", "m1", 10)
            await trio.sleep(0.2)
        if last:
            ctx.fig("health-worst", seconds(ctx.ledger.worst_s("health")))
            ctx.fig("completion-worst", seconds(ctx.ledger.worst_s("completion")))
            spoke = sum(peer_spoke(s.socket.fileno()) for s in streams)
            ctx.fig("closed-by-router", spoke)
    finally:
        for stream in streams:
            await stream.aclose()


SCENARIOS = [
    Scenario("disconnect-storm", "clients drop at every await", preset_launch(
        {m: {} for m in STORM_MODELS}, 1), disconnect_storm, cap_s=(60, 240)),
    Scenario("load-storm", "requests over 6 models, 2 slots", preset_launch(
        {m: {} for m in TINY}, 2), load_storm, cap_s=(60, 240)),
    Scenario("swap-churn", "16 clients alternating 2 models, 1 slot", preset_launch(
        {"m1": {}, "m2": {}}, 1), swap_churn, cap_s=(120, 400)),
    Scenario("idle-connections", "thousands of idle connections", preset_launch(
        {"m1": {}}, 1), idle_connections, cap_s=(60, 120)),
]  # fmt: skip
