"""Connections held open by an attacker: thousands of half-sent heads
(slowloris) and ``GET /health`` requests declaring a body they never send, then a real
client, which must be served in under a second; and a body trickled a byte every 2 s,
which must be closed once its grace is over (troupe: ``--body-min-rate``)."""

from __future__ import annotations

import contextlib
import time

import trio

from chaos.client import OK
from chaos.scenario import Ctx, Scenario, preset_launch, seconds, until_ok
from chaos.scenarios.malformed import dripped

HALF_HEAD = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n"  # never complete
BODY_NEVER_SENT = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000000\r\n\r\n"
SERVED_WITHIN_S = 1.0
GRACE_S = 2.0  # --body-rate-grace for the trickle (the default is 10 s)


async def _open(ctx: Ctx, n: int, wire: bytes, into: list[trio.SocketStream]) -> None:
    limiter = trio.CapacityLimiter(100)

    async def one() -> None:
        try:
            async with limiter:
                stream = await trio.open_tcp_stream(*ctx.client.address)
        except OSError:
            return
        into.append(stream)
        with contextlib.suppress(OSError, trio.BrokenResourceError):
            await stream.send_all(wire)

    with trio.move_on_after(60):
        async with trio.open_nursery() as nursery:
            for _ in range(n):
                nursery.start_soon(one)


async def slowloris(ctx: Ctx) -> None:
    """2,000 half heads and 1,045 bodies never sent on /health (troupe's default
    --max-connections 1024), held open; then a completion and /health, timed."""
    await until_ok(ctx, "setup", ctx.healthy, 30)  # loaded: what is timed is the edge
    half, bodies = ctx.size(2000, 2000), ctx.size(1045, 1045)
    held: list[trio.SocketStream] = []
    t0 = time.monotonic()
    try:
        await _open(ctx, half, HALF_HEAD, held)
        await _open(ctx, bodies, BODY_NEVER_SENT, held)
        ctx.fig("opened", f"{len(held)}in{seconds(time.monotonic() - t0)}")
        if len(held) < half + bodies:
            ctx.fail(f"only {len(held)} of {half + bodies} connections could be opened")
        await trio.sleep(0.2)  # every attacker's bytes are in before the real client
        got = await ctx.request("served", ctx.healthy, 10)
        ctx.fig("completion", seconds(got.elapsed))
        health = ctx.ledger.add("health", await ctx.client.call("GET", "/health", bound=10))
        ctx.fig("health", seconds(health.elapsed))
        for name, answer in (("completion", got), ("/health", health)):
            if answer.kind == OK and answer.elapsed > SERVED_WITHIN_S:
                ctx.fail(f"{name} served in {seconds(answer.elapsed)} (over {SERVED_WITHIN_S} s)")
        ctx.fig("fds-held", ctx.router.fds())
    finally:
        for stream in held:
            await trio.aclose_forcefully(stream)
    ctx.require("served", OK)
    ctx.require("health", OK)


async def trickled_body(ctx: Ctx) -> None:
    """A body a byte every 2 s: closed (408) after the grace, not at the total bound."""
    head = (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    )
    bound = GRACE_S + 6.0
    answer, took, timed_out = await dripped(ctx, head, b" ", 2.0, bound)
    ctx.fig("closed-after", seconds(took))
    if timed_out:
        ctx.fail(f"a body trickled a byte every 2 s still open after {bound:g} s")
    elif not answer.startswith(b"HTTP/1.1 408 "):
        ctx.fail(f"the trickled body was answered {answer[:12]!r} (expected a 408)")


def _pace_flags(ctx: Ctx) -> tuple[str, ...]:
    if "--body-rate-grace" not in ctx.troupe_flags:
        return ()
    return ("--body-rate-grace", str(GRACE_S))


SCENARIOS = [
    Scenario("slowloris", "2,000 half heads + 1,045 bodies never sent, then a client",
             preset_launch({"m1": {}}, 1), slowloris, cap_s=(60, 120)),
    Scenario("trickled-body", "a body a byte every 2 s", preset_launch(
        {"m1": {}}, 1, troupe_extra=_pace_flags), trickled_body, cap_s=(30, 60)),
]  # fmt: skip
