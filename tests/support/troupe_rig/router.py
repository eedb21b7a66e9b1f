"""A whole troupe router inside the caller's Trio run, for tests and benchmarks.

`open_router` parses llama-server-style arguments exactly as ``troupe serve`` does,
serves on a free port, and on exit shuts down in the service's order (every child
through its stop ladder), so a test never leaves a process behind.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import attrs
import httpx
import trio

from troupe.assembly import Troupe, build_troupe
from troupe.child.ledger import PidLedger
from troupe.engine import probe_engine
from troupe.prepare import split_troupe_flags
from troupe.sched import Snapshot, Status
from troupe.service import serve_router, shutdown
from troupe.settings.argv import parse_engine_args
from troupe.settings.options import load_option_table
from troupe.settings.router import build_settings, with_router_options
from troupe_rig.reaper import guard_state_dir

__all__ = ["RouterFactory", "RunningRouter", "open_router", "write_preset"]


@attrs.frozen
class RunningRouter:
    ctx: Troupe
    url: str  # e.g. "http://127.0.0.1:40123"

    def client(self, **kwargs: object) -> httpx.AsyncClient:
        """An HTTP client for this router (no timeout unless given)."""
        kwargs.setdefault("timeout", httpx.Timeout(60.0))
        return httpx.AsyncClient(base_url=self.url, **kwargs)  # type: ignore[arg-type]

    @property
    def snapshot(self) -> Snapshot:
        return self.ctx.scheduler.snapshot

    def status(self, model: str) -> Status:
        return self.snapshot.models[model].status

    async def wait_for_status(self, model: str, *statuses: Status, within: float = 60) -> Snapshot:
        """Wait (event-driven) until ``model`` has one of ``statuses``; a model that fails
        instead (unloaded with an error) ends the wait with an AssertionError."""

        def settled(snap: Snapshot) -> bool:
            view = snap.models.get(model)
            return view is not None and (view.status in statuses or view.failed)

        with trio.fail_after(within):
            snap = await self.ctx.scheduler.wait_until(settled)
        view = snap.models[model]
        assert view.status in statuses, f"{model} failed: {view.last_error}"
        return snap


@asynccontextmanager
async def open_router(
    args: Sequence[str],
    *,
    engine: Path,
    state_dir: Path,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> AsyncIterator[RunningRouter]:
    """Run a router with ``args`` (``--port 0`` and ``--state-dir state_dir`` unless given)
    until the block ends."""
    env = dict(os.environ if environ is None else environ)
    argv = list(args)
    if "--port" not in argv:
        argv += ["--port", "0"]
    if "--state-dir" not in argv:  # the journal and observed memory stay with the test
        argv += ["--state-dir", str(state_dir)]
    table = with_router_options(load_option_table(engine))
    own, rest = split_troupe_flags(argv)
    settings = build_settings(table, parse_engine_args(rest, table), own, env)
    ledger = PidLedger(state_dir)
    guard_state_dir(state_dir)  # its children are killed if this process dies
    ctx = build_troupe(settings, probe_engine(engine, "test"), table, ledger, env, cwd)
    try:
        async with trio.open_nursery() as nursery:
            urls = await nursery.start(serve_router, ctx)
            try:
                yield RunningRouter(ctx, urls[0])
            finally:
                with trio.CancelScope(shield=True):
                    await shutdown(ctx)
                nursery.cancel_scope.cancel()
    finally:
        ctx.close()
        ledger.close()


RouterFactory = Callable[..., AbstractAsyncContextManager[RunningRouter]]


def write_preset(directory: Path, sections: Mapping[str, Mapping[str, str]]) -> Path:
    """``directory/preset.ini`` from ``{section: {key: value}}``; a model section without
    ``model`` gets ``directory/<name>.gguf`` (the fake engine does not read it)."""
    lines: list[str] = []
    for name, keys in sections.items():
        lines.append(f"[{name}]")
        if name != "*" and "model" not in keys:
            placeholder = directory / f"{name}.gguf"
            placeholder.touch()  # the fake engine checks that its model file exists
            lines.append(f"model = {placeholder}")
        lines += [f"{k} = {v}" for k, v in keys.items()]
        lines.append("")
    path = directory / "preset.ini"
    path.write_text("\n".join(lines))
    return path
