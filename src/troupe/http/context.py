"""`RouterContext`: the composition root of one running router.

It builds the scheduler, the transport and the memory reader, and answers the
scheduler's questions about the outside world (how to start a model's child, how
to read the model sources, where the cache files are). It holds no state of its
own that the scheduler acts on: the catalogue lives in the scheduler, which swaps
it on reload; reload and removal are messages the scheduler carries out.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from troupe.actors.instance import LaunchSpec
from troupe.actors.memory import MemorySampler, ObservedStore, gpu_name
from troupe.actors.scheduler import ModelUnavailable, Scheduler
from troupe.catalog import Catalog, ModelEntry, build_catalog, check_startup
from troupe.catalog.facts import FactsCache
from troupe.catalog.hfcache import cache_dir
from troupe.catalog.memory import model_need
from troupe.catalog.prepared import PreparedCatalog
from troupe.catalog.removal import remove_cached
from troupe.child.ledger import PidLedger, default_state_dir
from troupe.child.ports import free_port
from troupe.download.router import RouterDownloads
from troupe.engine import Engine
from troupe.errors import ConfigError, TroupeError
from troupe.gguf import ModelFacts
from troupe.hardware.devices import DeviceReader
from troupe.http.conversations import ConversationTracker
from troupe.ops.logs import ModelLogs
from troupe.ops.metrics import RouterMetrics
from troupe.proxy.relay import Relay
from troupe.sched import ModelConfig, SchedulerCore
from troupe.sched.memory import MemoryLedger
from troupe.settings.options import OptionTable
from troupe.settings.router import RouterSettings

if TYPE_CHECKING:
    from troupe.http.server.lifecycle import HttpServer

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
        self.cwd = catalog.cwd
        self.environ = environ
        self.facts = facts or FactsCache()
        self._facts_lock = threading.Lock()  # scans run in worker threads
        self.fake_timing = bool(environ.get(FAKE_TIMING_ENV))
        # Memory admission: devices read once for the estimates' layout, then sampled
        # whenever the scheduler needs a fresh reading.
        self._reader = DeviceReader("auto" if use_nvml else None)
        self.devices = self._reader.read()  # totals for feasibility; free memory is sampled
        self.gpus = tuple(gpu_name(g.index) for g in self.devices.gpus)
        state_dir = settings.state_dir or default_state_dir()
        self.observed = ObservedStore(state_dir / "observed-memory.json")
        margin = settings.memory_margin_bytes
        prepared = self.prepare(catalog)
        core = SchedulerCore(
            prepared.configs,
            settings.models_max,
            fake_timing=self.fake_timing,
            queue_max=settings.queue_max,
            memory=MemoryLedger(margin) if margin is not None else None,
            drain_after=settings.drain_after,
            measure=True,  # the engine's own projection, for every model it can read
        )
        sampler = MemorySampler(self._reader) if margin is not None else None
        # One transport for every byte sent to a child; the scheduler tells it when a
        # child is gone, so no connection to a dead child stays open or is reused.
        self.metrics = RouterMetrics(settings.api_prefix)  # troupe.ops: fed by the scheduler
        self.logs = ModelLogs()  # every model's log, across its children
        self.relay = Relay(float(settings.timeout), observe=self.metrics.observe_relay)
        token = next((v for o, v in settings.base_args if o.long_name == "--hf-token"), None)
        self.downloads = RouterDownloads(environ, state_dir, token)  # POST /models
        self.scheduler = Scheduler(
            core,
            self,
            prepared,
            ledger=ledger,
            sampler=sampler,
            transport=self.relay,
            downloads=self.downloads,
        )
        self.scheduler.add_listener(self.metrics.on_event)
        self.scheduler.add_listener(self.logs.on_event)
        self.conversations = ConversationTracker()
        self.ready = False
        self.http_stop = trio.Event()
        self.http_done = trio.Event()
        self.http_server: HttpServer | None = None  # set by serve_http (the drain's handle)
        # status.args shows the last rendered command line (port 0 before a first load).
        self._last_args: dict[str, list[str]] = {}

    @property
    def catalog(self) -> Catalog:
        """The catalogue in effect (the scheduler's; replaced whole on reload)."""
        return self.scheduler.catalogue.catalog

    def rejection(self, entry: ModelEntry) -> str | None:
        """Why ``entry`` cannot run as a text model (a CLIP projector file), or None.
        Worked out once per catalogue: no file system access on the request path."""
        return self.scheduler.catalogue.rejection(entry)

    # ----- Launcher (for the scheduler) ---------------------------------------------------

    def prepare(self, catalog: Catalog) -> PreparedCatalog:
        """What the scheduler needs from a fresh catalogue (reads GGUF headers)."""
        with self._facts_lock:
            rejections = {}
            for entry in catalog:
                facts = self.facts.facts(entry.model_path)
                if isinstance(facts, ModelFacts) and facts.rejection:
                    rejections[entry.name] = facts.rejection
            return PreparedCatalog(catalog, tuple(self.model_configs(catalog)), rejections)

    def scan(self) -> PreparedCatalog:
        """Re-read every model source (§6.9 step 1); ConfigError when one is broken."""
        catalog = build_catalog(
            self.settings,
            self.table,
            self.environ,
            self.cwd,
            reload=True,
            probe=self.facts.architecture,
        )
        return self.prepare(catalog)

    def remove_files(self, model: str) -> bool:
        return remove_cached(cache_dir(self.environ), model)

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
            load_timeout=self.settings.load_timeout,
            log_sink=self.logs.writer(model),
        )

    def measure_command(self, model: str) -> tuple[list[str], dict[str, str]]:
        entry = self.catalog.get(model)
        if entry is None:
            raise ConfigError(f"model {model} is not in the catalogue")
        return self.render_args(entry, free_port()), dict(self.environ)

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
