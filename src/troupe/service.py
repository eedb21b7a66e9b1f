"""The root of the running router: one nursery, the shutdown order, signals.

Root nursery (one_for_all): the scheduler actor, the HTTP server and the signal
watcher are siblings, so a bug in either stops the whole service loudly rather
than leaving it half-alive (DESIGN principle 5).

Shutdown (the drain): end the /models/sse streams; the scheduler answers every
waiting request and starts no load; stop accepting, and let requests in flight
finish up to ``--drain-timeout``; then stop every child in parallel, each through its
ladder. Every step is bounded, so the whole stop is; a second signal exits 1 at once.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator

import trio

from troupe.actors.scheduler import Scheduler
from troupe.child.ledger import PidLedger, default_state_dir, reap_orphans
from troupe.child.process import kill_group
from troupe.engine import Engine
from troupe.errors import TroupeError
from troupe.http.context import RouterContext, build_context
from troupe.http.server import serve_http
from troupe.ops.ready import ready_line
from troupe.settings.options import OptionTable
from troupe.settings.router import RouterSettings

__all__ = ["run_service", "serve_router"]

log = logging.getLogger("troupe.service")

SHUTDOWN_GRACE = 5.0  # beyond the slowest stop ladder, before children are killed outright


HTTP_GRACE = 5.0  # beyond the drain, for handlers to end once cut


def run_service(settings: RouterSettings, engine: Engine, table: OptionTable) -> int:
    """Run the router until a signal; returns the process exit status."""
    try:
        return trio.run(_main, settings, engine, table)
    except TroupeError as exc:
        print(f"troupe: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BaseExceptionGroup as group:
        # Raised inside a nursery (a load-on-startup failure): one line, no traceback.
        errors, rest = group.split(TroupeError)
        if errors is None or rest is not None:
            raise
        error = _first_leaf(errors)
        print(f"troupe: error: {error}", file=sys.stderr)
        return error.exit_code


def _first_leaf(group: BaseExceptionGroup[TroupeError]) -> TroupeError:
    first = group.exceptions[0]
    return first if isinstance(first, TroupeError) else _first_leaf(first)


async def _main(settings: RouterSettings, engine: Engine, table: OptionTable) -> int:
    state_dir = settings.state_dir or default_state_dir()
    for pid in reap_orphans(state_dir):
        log.warning("reaped orphaned child pid=%d left by a dead troupe", pid)
    ledger = PidLedger(state_dir)
    try:
        ctx = build_context(settings, engine, table, ledger)
        try:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async with trio.open_nursery() as root:
                    await root.start(serve_router, ctx)
                    # What start-up built lives as long as the process: out of the
                    # collector's sight, a full collection no longer scans it (88 ms
                    # pauses under load before, each a p99 spike).
                    gc.freeze()
                    sig = await _first_signal(signals)
                    log.info("%s: shutting down", signal.Signals(sig).name)
                    root.start_soon(_second_signal_exits, signals, ctx.scheduler)
                    await shutdown(ctx)
                    root.cancel_scope.cancel()
        finally:
            ctx.close()
    finally:
        ledger.close()
    return 0


async def _first_signal(signals: AsyncIterator[int]) -> int:
    async for sig in signals:
        return sig
    raise AssertionError("signal receiver closed")


async def _second_signal_exits(signals: AsyncIterator[int], scheduler: Scheduler) -> None:
    async for sig in signals:
        log.error("%s again: exiting at once", signal.Signals(sig).name)
        _kill_children(scheduler)
        os._exit(1)


def _kill_children(scheduler: Scheduler) -> None:
    for model in list(scheduler.snapshot.models):
        inst = scheduler.instance(model)
        if inst is not None and inst.pid is not None:
            kill_group(inst.pid)


async def serve_router(
    ctx: RouterContext, *, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED
) -> None:
    """Scheduler + HTTP server; reports the bound URLs once listening."""
    async with trio.open_nursery() as nursery:
        await nursery.start(ctx.scheduler.run)
        urls = await nursery.start(serve_http, ctx)
        ctx.ready = True  # upstream: ready right after binding, before startup loads
        for url in urls:
            # Always shown, whatever the log level: with --port 0 it is how to find the port.
            log.log(max(logging.INFO, log.getEffectiveLevel()), "listening on %s", url)
        log.log(max(logging.INFO, log.getEffectiveLevel()), "%s", ready_line(ctx, urls))
        task_status.started(urls)
        await ctx.downloads.resume(ctx.scheduler)
        await ctx.load_on_startup()


async def shutdown(ctx: RouterContext) -> None:
    ctx.scheduler.bus.close()  # SSE streams end now, not when the graceful window cuts them
    with trio.move_on_after(SHUTDOWN_GRACE):
        await ctx.scheduler.drain()  # waiters answered, no new load
    if ctx.http_server is not None:  # no new connection; idle keep-alive ones closed
        ctx.http_server.stop_accepting()
        ctx.http_server.close_idle()
    drain = ctx.settings.drain_timeout
    with trio.move_on_after(drain) as scope:  # requests in flight get up to --drain-timeout
        await ctx.scheduler.wait_until(lambda s: not any(m.in_flight for m in s.models.values()))
    if scope.cancelled_caught:
        log.warning("requests still in flight after the %gs drain: cutting them", drain)
    with trio.move_on_after(HTTP_GRACE) as scope:
        await ctx.stop_http()
    if scope.cancelled_caught:
        log.error("HTTP handlers still running %gs after the server was stopped", HTTP_GRACE)
    deadline = ctx.max_stop_seconds() + SHUTDOWN_GRACE
    with trio.move_on_after(deadline) as scope:
        await ctx.scheduler.stop_all()
    if scope.cancelled_caught:
        log.error("children still running after %gs: killing them", deadline)
        _kill_children(ctx.scheduler)
