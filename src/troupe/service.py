"""The root of the running router: one nursery, the shutdown order, signals.

Root nursery (one_for_all): the scheduler actor, the HTTP server and the signal
watcher are siblings, so a bug in either stops the whole service loudly rather
than leaving it half-alive (ARCHITECTURE.md, principle 5).

Shutdown: end the /models/sse streams; the scheduler answers every
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
from functools import partial

import trio

from troupe.actors.scheduler import ModelUnavailable, Scheduler
from troupe.assembly import Troupe, build_troupe
from troupe.child.ledger import PidLedger, default_state_dir, reap_orphans
from troupe.child.process import kill_group
from troupe.cluster.agent import Agent
from troupe.engine import Engine
from troupe.errors import TroupeError
from troupe.http.model_routes import reload_all
from troupe.http.routes import ROUTES
from troupe.http.serve import serve_http
from troupe.ollama import OLLAMA_ROUTES, OLLAMA_UNDER
from troupe.ops.ready import ready_line
from troupe.realtime import serve_realtime
from troupe.settings.options import OptionTable
from troupe.settings.router import RouterSettings

__all__ = ["HTTP_GRACE", "SHUTDOWN_GRACE", "run_service", "serve_router", "shutdown"]

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
        router = build_troupe(settings, engine, table, ledger)
        try:
            with (
                trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals,
                trio.open_signal_receiver(signal.SIGHUP) as hangups,
            ):
                async with trio.open_nursery() as root:
                    await root.start(serve_router, router)
                    root.start_soon(_reload_on_hangup, router, hangups)
                    # What start-up built lives as long as the process: out of the
                    # collector's sight, a full collection no longer scans it (88 ms
                    # pauses under load before, each a p99 spike).
                    gc.freeze()
                    sig = await _first_signal(signals)
                    log.info("%s: shutting down", signal.Signals(sig).name)
                    root.start_soon(_second_signal_exits, signals, router.scheduler)
                    await shutdown(router)
                    root.cancel_scope.cancel()
        finally:
            router.close()
    finally:
        ledger.close()
    return 0


async def _reload_on_hangup(router: Troupe, hangups: AsyncIterator[int]) -> None:
    """``SIGHUP``: read the tenants file again and reload the catalog, as
    ``POST /models/reload`` does; a bad tenants file is logged and the old one kept."""
    async for _ in hangups:
        log.info("SIGHUP: reloading the tenants file and the model catalog")
        failure, _kept = await reload_all(router)  # (a kept tenants file is logged)
        if failure is not None:
            log.warning("reload: %s", failure.message)


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


class SchedulerCopies:
    """The scheduler as the cluster's give-back of copies sees it (`Cluster.give_back`)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler

    def loaded(self) -> list[str]:
        models = self._scheduler.snapshot.models
        return [name for name, m in models.items() if m.status.is_running and not m.stopping]

    async def keep_alive(self, model: str, seconds: float) -> None:
        await self._scheduler.keep_alive(model, None, seconds)


async def serve_router(
    router: Troupe, *, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED
) -> None:
    """Scheduler + HTTP server; reports the bound URLs once listening."""
    async with trio.open_nursery() as nursery:
        await nursery.start(router.scheduler.run)
        routes = ROUTES.extended(OLLAMA_ROUTES, OLLAMA_UNDER)  # Ollama's API beside llama.cpp's
        urls = await nursery.start(
            partial(serve_http, router, websocket=serve_realtime, routes=routes)
        )
        nursery.start_soon(router.requests.write_lines)  # the access log (--access-log on)
        nursery.start_soon(router.accounts.run)  # tenants' budgets and usage, saved
        nursery.start_soon(router.history.run, router.scheduler, router.metrics)
        if router.cluster is not None:
            nursery.start_soon(router.cluster.run)  # the peers' /models, kept fresh
            # Copies made by failover or spill go back once their home is up again.
            copies = SchedulerCopies(router.scheduler)
            nursery.start_soon(router.cluster.give_back, copies, router.settings.cluster_copy_ttl)
            if router.kv is not None and router.kv.replicas is not None:
                nursery.start_soon(router.kv.replicas.run)  # KV saves pushed to the next nodes
            if router.settings.cluster_agent_port >= 0:  # HAProxy's agent-check (per model)
                agent = Agent(router.cluster, lambda: router.scheduler.snapshot)
                host = next((h for h in router.settings.hosts if "/" not in h), "127.0.0.1")
                await nursery.start(agent.serve, host, router.settings.cluster_agent_port)
        router.ready = True  # upstream: ready right after binding, before startup loads
        for url in urls:
            # Always shown, whatever the log level: with --port 0 it is how to find the port.
            log.log(max(logging.INFO, log.getEffectiveLevel()), "listening on %s", url)
        names = [e.name for e in router.catalog]
        line = ready_line(router.settings, names, urls)
        log.log(max(logging.INFO, log.getEffectiveLevel()), "%s", line)
        task_status.started(urls)
        await router.downloads.resume(router.scheduler)
        await load_on_startup(router)


async def load_on_startup(router: Troupe) -> None:
    """Spawn each ``load-on-startup`` model in turn, once the server listens (as upstream)."""
    for name in router.catalog.startup_models():
        try:
            await router.scheduler.load(name)
        except ModelUnavailable as exc:
            raise TroupeError(f"failed to load models on startup: {name}: {exc}") from None


async def shutdown(router: Troupe) -> None:
    scheduler = router.scheduler
    if router.cluster is not None:
        router.cluster.leaving = True  # the balancer's agent checks now say drain
    scheduler.bus.close()  # SSE streams end now, not when the graceful window cuts them
    with trio.move_on_after(SHUTDOWN_GRACE):
        await scheduler.begin_shutdown()  # waiters answered, no new load
    if router.http_server is not None:  # no new connection; idle keep-alive ones closed
        router.http_server.stop_accepting()
        router.http_server.close_idle()
    drain = router.settings.drain_timeout
    with trio.move_on_after(drain) as scope:  # requests in flight get up to --drain-timeout
        await scheduler.wait_until(lambda s: not any(m.in_flight for m in s.models.values()))
    if scope.cancelled_caught:
        log.warning("requests still in flight after the %gs drain: cutting them", drain)
    with trio.move_on_after(HTTP_GRACE) as scope:
        await _stop_http(router)
    if scope.cancelled_caught:
        log.error("HTTP handlers still running %gs after the server was stopped", HTTP_GRACE)
    deadline = _max_stop_seconds(router) + SHUTDOWN_GRACE
    with trio.move_on_after(deadline) as scope:
        await scheduler.stop_all()
    if scope.cancelled_caught:
        log.error("children still running after %gs: killing them", deadline)
        _kill_children(scheduler)


async def _stop_http(router: Troupe) -> None:
    router.http_stop.set()
    await router.http_done.wait()
    with trio.CancelScope(shield=True):
        await router.relay.aclose()
        if router.cluster is not None:
            await router.cluster.aclose()


def _max_stop_seconds(router: Troupe) -> float:
    return max((e.stop_timeout + e.term_grace for e in router.catalog), default=15.0)
