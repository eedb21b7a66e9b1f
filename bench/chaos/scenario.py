"""What a scenario is, and what it gets to work with (`Ctx`)."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from chaos.client import OK, Answer, Client
from chaos.invariants import Ledger
from chaos.procs import Seen, catch_child, signal_quietly
from chaos.routers import Launch, Router

HEALTHY = "m1"  # the real model every scenario's final completion asks for
TINY = ("m1", "m2", "m3", "m4", "m5", "m6")


@dataclass
class Ctx:
    """One scenario's run against one router."""

    router: Router
    quick: bool
    models_dir: Path  # the real tiny models, m1.gguf ... m6.gguf (and slow.gguf)
    workdir: Path
    troupe_flags: frozenset[str]  # the flags this troupe's `serve --help` lists
    ledger: Ledger = field(default_factory=Ledger)
    figures: dict[str, str] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    healthy: str = HEALTHY
    checks_router: bool = True  # False: the scenario ends the router itself
    rebaseline: bool = False  # True: a restarted router; take a new baseline
    rss_base: int | None = None  # the RSS to compare with, when not the first baseline

    def size(self, quick: int, full: int) -> int:
        return quick if self.quick else full

    def fig(self, key: str, value: object) -> None:
        self.figures[key] = str(value)

    def fail(self, reason: str) -> None:
        self.failures.append(reason)

    def require(self, group: str, *allowed: str) -> None:
        self.failures += self.ledger.violations(group, allowed)

    def model_path(self, name: str) -> Path:
        own = self.workdir / "models" / f"{name}.gguf"
        return own if own.exists() else self.models_dir / f"{name}.gguf"

    @property
    def client(self) -> Client:  # the router's: it may have been restarted
        return self.router.client

    @property
    def is_troupe(self) -> bool:
        return self.router.is_troupe

    async def request(self, group: str, model: str, bound: float, **kw: Any) -> Answer:
        answer = await self.client.completion(model, bound=bound, **kw)
        return self.ledger.add(group, answer, model)

    async def catch(self, model: str, sig: int, within: float = 20.0) -> tuple[int, float] | None:
        """Signal ``model``'s next child the moment it starts (it is then loading)."""
        needle = str(self.model_path(model))
        return await trio.to_thread.run_sync(catch_child, self.router.pid, needle, sig, within)

    def children_for(self, model: str) -> list[Seen]:
        needle = str(self.model_path(model))
        return [s for s in self.router.tracker.all() if needle in s.cmd]

    def live_child(self, model: str) -> int | None:
        self.router.tracker.sample()
        live = {s.pid for s in self.router.tracker.survivors()}
        found = [s.pid for s in self.children_for(model) if s.pid in live]
        return found[-1] if found else None

    def signal_model(self, model: str, sig: int) -> int | None:
        pid = self.live_child(model)
        if pid is not None:
            signal_quietly(pid, sig)
        return pid


def write_preset(path: Path, sections: Mapping[str, Mapping[str, str]], models_dir: Path) -> Path:
    """An INI preset. A section's model is ``models_dir/<name>.gguf``; a section named
    otherwise gets its own copy of a tiny model (``copy = m2``), so every model has its
    own path and its child can be told apart by its command line, or a truncated copy
    (``truncated = m1``)."""
    lines: list[str] = []
    for name, given in sections.items():
        lines.append(f"[{name}]")
        keys = dict(given)
        source = keys.pop("copy", None)
        cut = keys.pop("truncated", None)  # the first 4 KiB of that model: a broken file
        if name != "*" and "model" not in keys:
            model = models_dir / f"{name}.gguf"
            if source is not None or cut is not None:
                model = path.parent / "models" / f"{name}.gguf"
                model.parent.mkdir(exist_ok=True)
                if cut is not None:
                    model.write_bytes((models_dir / f"{cut}.gguf").read_bytes()[:4096])
                elif not model.exists():
                    os.link(models_dir / f"{source}.gguf", model)
            lines.append(f"model = {model}")
        lines += [f"{k} = {v}" for k, v in keys.items()]
        lines.append("")
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("\n".join(lines))
    tmp.replace(path)  # a router reloading meanwhile never reads half a file
    return path


LaunchFn = Callable[[Ctx], Launch]
RunFn = Callable[[Ctx], Awaitable[None]]


@dataclass(frozen=True)
class Scenario:
    name: str
    what: str  # one line: the fault, and what must hold
    launch: LaunchFn
    run: RunFn
    needs_fake: bool = False  # the C++ router cannot run the fake engine (it spawns itself)
    quick: bool = True  # part of --quick
    cap_s: tuple[float, float] = (60.0, 300.0)  # quick, full: the whole scenario's bound
    starts_router: bool = False  # True: the scenario starts the router itself (no warm-up)


def preset_launch(
    sections: Mapping[str, Mapping[str, str]],
    models_max: int,
    extra: tuple[str, ...] = (),
    troupe_extra: Callable[[Ctx], tuple[str, ...]] = lambda ctx: (),
    env: Callable[[Ctx], dict[str, str]] = lambda ctx: {},
) -> LaunchFn:
    def launch(ctx: Ctx) -> Launch:
        preset = write_preset(ctx.workdir / "preset.ini", sections, ctx.models_dir)
        return Launch(models_max, None, preset, extra, troupe_extra(ctx), env(ctx))

    return launch


async def until_ok(ctx: Ctx, group: str, model: str, bound: float) -> Answer:
    """One request that must succeed (recorded); its answer."""
    got = await ctx.request(group, model, bound)
    if got.kind != OK:
        ctx.fail(f"{group}: {got.brief()} {got.error_message()[:60]}")
    return got


def seconds(value: float) -> str:
    return f"{value * 1000:.0f}ms" if value < 10 else f"{value:.1f}s"
