"""`RouterContext`: what the HTTP layer and the service share (one per running router)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Mapping
from pathlib import Path

import trio

from troupe.actors.instance import LaunchSpec
from troupe.actors.memory import MemorySampler, ObservedStore, gpu_name
from troupe.actors.scheduler import ModelUnavailable, Scheduler
from troupe.catalog import Catalog, ModelEntry, build_catalog, check_startup, needs_restart
from troupe.catalog.facts import FactsCache
from troupe.catalog.hfcache import cache_dir
from troupe.catalog.memory import model_need
from troupe.catalog.removal import remove_cached
from troupe.child.ledger import PidLedger, default_state_dir
from troupe.download.router import RouterDownloads
from troupe.engine import Engine
from troupe.errors import ConfigError, TroupeError
from troupe.gguf import ModelFacts
from troupe.hardware.devices import DeviceReader
from troupe.http.conversations import ConversationTracker
from troupe.proxy.relay import Relay
from troupe.sched import Failure, ModelConfig, SchedulerCore, Status
from troupe.sched.memory import MemoryLedger
from troupe.settings.options import OptionTable
from troupe.settings.router import RouterSettings

__all__ = ["RouterContext", "build_context", "fingerprint"]

log = logging.getLogger("troupe.router")

FAKE_TIMING_ENV = "LLAMA_SERVER_DEBUG_FAKE_TIMING"


def fingerprint(args: list[str]) -> str:
    """Identity of a command line: memory seen under one does not hold for another."""
    return hashlib.sha256("\0".join(args).encode()).hexdigest()[:16]


class RouterContext:
    """Settings, catalogue, scheduler and relay of one router, and how to start a child."""

    def __init__(
        self,
        settings: RouterSettings,
        engine: Engine,
        table: OptionTable,
        catalog: Catalog,
        ledger: PidLedger | None,
        environ: dict[str, str],
        facts: FactsCache | None = None,
        use_nvml: bool = True,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.table = table
        self.catalog = catalog
        self.environ = environ
        self.facts = facts or FactsCache()
        self._rejections = self._find_rejections(catalog)
        self.fake_timing = bool(environ.get(FAKE_TIMING_ENV))
        # Memory admission: devices read once for the estimates' layout, then sampled
        # whenever the scheduler needs a fresh reading.
        self._reader = DeviceReader("auto" if use_nvml else None)
        self.devices = self._reader.read()  # totals for feasibility; free memory is sampled
        self.gpus = tuple(gpu_name(g.index) for g in self.devices.gpus)
        state_dir = settings.state_dir or default_state_dir()
        self.observed = ObservedStore(state_dir / "observed-memory.json")
        margin = settings.memory_margin_bytes
        core = SchedulerCore(
            self.model_configs(catalog),
            settings.models_max,
            fake_timing=self.fake_timing,
            queue_max=settings.queue_max,
            memory=MemoryLedger(margin) if margin is not None else None,
        )
        sampler = MemorySampler(self._reader) if margin is not None else None
        token = next((v for o, v in settings.base_args if o.long_name == "--hf-token"), None)
        self.downloads = RouterDownloads(environ, state_dir, token)
        self.scheduler = Scheduler(
            core, self, ledger=ledger, sampler=sampler, downloads=self.downloads
        )
        self.relay = Relay(float(settings.timeout))
        self.conversations = ConversationTracker()
        self.ready = False
        self.http_stop = trio.Event()
        self.http_done = trio.Event()
        self._reload_lock = trio.Lock()
        # status.args shows the last rendered command line (port 0 before a first load).
        self._last_args: dict[str, list[str]] = {}

    # ----- Launcher (for the scheduler) ---------------------------------------------------

    def model_configs(self, catalog: Catalog) -> list[ModelConfig]:
        configs = []
        for e in catalog:
            fp = fingerprint(catalog.child_args(e, 0, bin_path=str(self.engine.path)))
            need = self.observed.get(e.name, fp) or model_need(e, self.facts, self.gpus)
            configs.append(
                ModelConfig(
                    name=e.name,
                    pin=e.pin,
                    ttl=float(e.ttl) if e.ttl else None,  # ttl = 0: never
                    fingerprint=fp,
                    need=need,
                )
            )
        return configs

    def remember_memory(self, model: str, used: Mapping[str, int]) -> None:
        entry = self.catalog.get(model)
        if entry is not None:
            fp = fingerprint(self.catalog.child_args(entry, 0, bin_path=str(self.engine.path)))
            self.observed.put(model, fp, used)

    def launch_spec(self, model: str) -> LaunchSpec:
        entry = self.catalog.get(model)
        if entry is None:
            raise ConfigError(f"model {model} is not in the catalogue")
        env = dict(self.environ)
        # The configured port, even 0 (upstream); its presence is what makes a child a child.
        env["LLAMA_SERVER_ROUTER_PORT"] = str(self.settings.port)

        def argv(port: int) -> list[str]:
            args = self.render_args(entry, port)
            self._last_args[model] = args
            return args

        return LaunchSpec(
            model=model,
            argv=argv,
            env=env,
            stop_timeout=float(entry.stop_timeout),
            term_grace=entry.term_grace,
            cwd=self.catalog.cwd,
        )

    def render_args(self, entry: ModelEntry, port: int) -> list[str]:
        return self.catalog.child_args(
            entry,
            port,
            bin_path=str(self.engine.path),
            app_cmd=self.environ.get("LLAMA_APP_CMD", ""),
        )

    def status_args(self, entry: ModelEntry) -> list[str]:
        return self._last_args.get(entry.name) or self.render_args(entry, 0)

    # ----- lifecycle ---------------------------------------------------------------------

    def max_stop_seconds(self) -> float:
        return max((e.stop_timeout + e.term_grace for e in self.catalog), default=15.0)

    async def stop_http(self) -> None:
        self.http_stop.set()
        await self.http_done.wait()
        with trio.CancelScope(shield=True):
            await self.relay.aclose()

    def close(self) -> None:
        self._reader.close()

    async def reload(self) -> None:
        """``GET /models?reload=1`` (§6.9): re-scan; restart running models whose preset
        changed or vanished, and wait for them; add new ones without loading them. A
        broken preset answers 500 and leaves the current catalogue working."""
        async with self._reload_lock:
            try:
                fresh = await trio.to_thread.run_sync(self._scan, True)
            except ConfigError as exc:
                raise ModelUnavailable(Failure.server_error(str(exc))) from None
            for warning in fresh.warnings:
                log.warning("%s", warning)
            running = {
                name
                for name, view in self.scheduler.snapshot.models.items()
                if view.status.is_running
            }
            restart = tuple(sorted(name for name in running if self._changed(name, fresh)))
            if restart:
                log.info("reload restarts %s", ", ".join(restart))
            await self.scheduler.begin_reload(restart)
            await self.scheduler.wait_until(
                lambda snap: all(
                    snap.models[n].status is Status.UNLOADED for n in restart if n in snap.models
                )
            )
            self.catalog = fresh
            self._rejections = self._find_rejections(fresh)
            self._last_args = {k: v for k, v in self._last_args.items() if k in fresh}
            await self.scheduler.finish_reload(tuple(self.model_configs(fresh)))

    def _scan(self, reload: bool) -> Catalog:
        return build_catalog(
            self.settings,
            self.table,
            self.environ,
            self.catalog.cwd,
            reload=reload,
            probe=self.facts.architecture,
        )

    def rejection(self, entry: ModelEntry) -> str | None:
        """Why ``entry`` cannot run as a text model (a CLIP projector file), or None.
        Worked out once per catalogue: no file system access on the request path."""
        return self._rejections.get(entry.name)

    def _find_rejections(self, catalog: Catalog) -> dict[str, str]:
        out = {}
        for entry in catalog:
            facts = self.facts.facts(entry.model_path)
            if isinstance(facts, ModelFacts) and facts.rejection:
                out[entry.name] = facts.rejection
        return out

    def _changed(self, name: str, fresh: Catalog) -> bool:
        old, new = self.catalog.get(name), fresh.get(name)
        return old is None or new is None or needs_restart(old.preset, new.preset)

    async def remove_cached_model(self, name: str) -> None:
        """``DELETE /models?model=``: stop it, delete its cache files, forget it (§8).
        Canonical names only: aliases are not resolved, as upstream."""
        entry = self.catalog.get(name)
        if entry is None and name in self.scheduler.snapshot.downloads:
            await self._remove_download(name)
            return
        if entry is None:
            raise ModelUnavailable(Failure.server_error(f"model name={name} is not found"))
        if not entry.can_remove:
            raise ModelUnavailable(
                Failure.server_error(f"model name={name} is not removable (not from cache)")
            )
        view = self.scheduler.snapshot.models.get(name)
        if view is not None and view.status.is_running:
            with contextlib.suppress(ModelUnavailable):
                await self.scheduler.unload(name)
            await self.scheduler.wait_until(
                lambda s: name not in s.models or not s.models[name].status.is_running
            )
        cache = cache_dir(self.environ)
        removed = await trio.to_thread.run_sync(remove_cached, cache, name)
        log.info(
            "removing model name=%s from cache (%s)", name, "succeeded" if removed else "partial"
        )
        await self.reload()
        self.scheduler.bus.publish({"model": name, "event": "model_remove"})

    async def _remove_download(self, name: str) -> None:
        """``DELETE`` on a download: cancel it (answered once the job ended), delete what
        it left in the cache, forget the entry (§8)."""
        view = self.scheduler.snapshot.downloads[name]
        if view.status is Status.DOWNLOADING:
            with contextlib.suppress(ModelUnavailable):  # it may have ended meanwhile
                await self.scheduler.unload(name)
        view = self.scheduler.snapshot.downloads.get(name, view)
        removed = await trio.to_thread.run_sync(remove_cached, cache_dir(self.environ), name)
        log.info(
            "removing model name=%s from cache (%s)", name, "succeeded" if removed else "partial"
        )
        await self.scheduler.forget_downloads({name: view.job})
        self.scheduler.bus.publish({"model": name, "event": "model_remove"})

    async def load_on_startup(self) -> None:
        """Spawn each ``load-on-startup`` model in turn, once the server listens (§6.8)."""
        for name in self.catalog.startup_models():
            try:
                await self.scheduler.load(name)
            except ModelUnavailable as exc:
                raise TroupeError(f"failed to load models on startup: {name}: {exc}") from None


def build_context(
    settings: RouterSettings,
    engine: Engine,
    table: OptionTable,
    ledger: PidLedger | None,
    environ: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> RouterContext:
    env = dict(os.environ if environ is None else environ)
    facts = FactsCache(no_mmproj=_no_mmproj(settings))
    try:
        catalog = build_catalog(settings, table, env, cwd or Path.cwd(), probe=facts.architecture)
        check_startup(catalog, settings.models_max)
    except ConfigError as exc:
        raise ConfigError(f"failed to initialize router models: {exc}") from None
    for warning in catalog.warnings:
        log.warning("%s", warning)
    log.info("%d models in the catalogue", len(catalog))
    return RouterContext(settings, engine, table, catalog, ledger, env, facts)


def _no_mmproj(settings: RouterSettings) -> bool:
    """``--no-mmproj`` on the router command line hides projector modalities (§2.8)."""
    return any(
        opt.env == "LLAMA_ARG_MMPROJ_AUTO" and value == "0" for opt, value in settings.base_args
    )
