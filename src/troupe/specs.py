"""`ChildSpecs`: the scheduler's answers about the outside world.

How to start a model's child (its command line, environment, stop ladder), how to
measure one, how to read the model sources again, where a model's cache files are,
and what a model was seen to hold. It implements the scheduler's `Specs`
protocol and holds nothing the scheduler acts on: the catalog it reads is the
scheduler's own (swapped whole on reload), reached through `read_catalog_from`.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from troupe.actors.instance import LaunchSpec
from troupe.actors.memory import ObservedStore
from troupe.catalog import Catalog, ModelEntry, build_catalog
from troupe.catalog.build import base_preset
from troupe.catalog.facts import FactsCache
from troupe.catalog.figure import estimated_need, kv_swa_full, with_kv_layout
from troupe.catalog.hfcache import cache_dir
from troupe.catalog.prepared import PreparedCatalog
from troupe.catalog.removal import remove_cached
from troupe.catalog.render import restart_key
from troupe.child.argcheck import SectionChecks
from troupe.child.cpu_flags import cpu_flags, cpu_request
from troupe.child.gpu_flags import gpu_flags, gpu_request
from troupe.child.ports import free_port
from troupe.engine import Engine
from troupe.errors import ConfigError
from troupe.gguf import ModelFacts
from troupe.kvstore import KvService
from troupe.ops.logs import ModelLogs
from troupe.sched import ModelConfig, RestartKey
from troupe.sched.cpu import CpuPlan
from troupe.sched.devices import GpuPlan, GpuRequest
from troupe.settings.options import OptionTable
from troupe.settings.router import RouterSettings

__all__ = ["ChildSpecs", "fingerprint", "projection_argv"]

log = logging.getLogger("troupe.specs")

# Options that name a file: the engine's parser only stores them (the child's load
# reports a missing one), so a section that adds only these needs no check.
_PATH_ENVS = frozenset({"LLAMA_ARG_MODEL", "LLAMA_ARG_MMPROJ", "LLAMA_ARG_ALIAS"})


def projection_argv(
    catalog: Catalog, entry: ModelEntry, engine: str, environ: Mapping[str, str], swa_full: bool
) -> list[str]:
    """The engine's memory projection for ``entry``: its child's own command line (the
    router's measurement and ``troupe doctor`` alike, so both show one need)."""
    args = catalog.child_args(
        entry, free_port(), bin_path=engine, app_cmd=environ.get("LLAMA_APP_CMD", "")
    )
    if cpu_request(entry.preset.get_spelling) is None:
        # A projection computes nothing worth a second thread (it stops before the
        # weights load): one thread, so it never competes with a child that serves.
        args += ["--threads", "1", "--threads-batch", "1"]
    return with_kv_layout(args, swa_full)  # the KV layout its child will have (--swa-full)


def fingerprint(args: list[str]) -> str:
    """Identity of a command line: memory seen under one does not hold for another."""
    return hashlib.sha256("\0".join(args).encode()).hexdigest()[:16]


class _CatalogOwner(Protocol):
    @property
    def prepared(self) -> PreparedCatalog: ...


class ChildSpecs:
    """The scheduler's `Specs`: child command lines, scans, cache files, memory seen."""

    def __init__(
        self,
        settings: RouterSettings,
        engine: Engine,
        table: OptionTable,
        environ: dict[str, str],
        cwd: Path,
        *,
        facts: FactsCache,
        observed: ObservedStore,
        logs: ModelLogs,
        gpus: tuple[str, ...],
        kv: KvService | None = None,
        gpu_ids: Mapping[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.table = table
        self.environ = environ
        self.cwd = cwd
        self.facts = facts
        self.observed = observed
        self.logs = logs
        self.gpus = gpus
        # --gpu-placement auto: troupe's GPU name -> the engine's id ("cuda:1" -> "CUDA1")
        # for each GPU children are placed on (empty: none, or placement off)
        self.gpu_ids = dict(gpu_ids or {})
        self.device_names = {engine: name for name, engine in self.gpu_ids.items()}
        # The KV store (None: --kv-store off with one tenant; with several, no files)
        self.kv = kv
        self._facts_lock = threading.Lock()  # scans run in worker threads
        self._owner: _CatalogOwner | None = None
        # status.args shows the last rendered command line (port 0 before a first load).
        self._last_args: dict[str, list[str]] = {}
        self._sections = SectionChecks(environ)  # each section's flags, by the engine

    def read_catalog_from(self, owner: _CatalogOwner) -> None:
        """The catalog in effect is ``owner``'s (the scheduler's, replaced on reload)."""
        self._owner = owner

    @property
    def catalog(self) -> Catalog:
        if self._owner is None:
            raise RuntimeError("the launcher has no catalog yet (read_catalog_from)")
        return self._owner.prepared.catalog

    # ----- catalogs ----------------------------------------------------------------------

    def prepare(self, catalog: Catalog) -> PreparedCatalog:
        """What the scheduler needs from a fresh catalog (reads GGUF headers, and has
        the engine parse each section's own flags). A model whose command line the
        engine refuses is rejected with the engine's message, at start-up as on a
        reload: the other models serve (upstream's router starts such a model and fails
        its first load; troupe says why before any request)."""
        refused = self._sections.refusals(self._section_argvs(catalog))
        with self._facts_lock:
            rejections = {}
            for entry in catalog:
                facts = self.facts.facts(entry.model_path)
                if isinstance(facts, ModelFacts) and facts.rejection:
                    rejections[entry.name] = facts.rejection
            for name, message in sorted(refused.items()):
                log.error("preset section [%s]: the engine refuses its flags: %s", name, message)
                rejections[name] = f"the engine refuses its flags: {message}"
            return PreparedCatalog(catalog, tuple(self.model_configs(catalog)), rejections)

    def _section_argvs(self, catalog: Catalog) -> dict[str, list[str]]:
        """The child command line of each model whose section adds flags to the router's
        own (those were checked at start-up; a bare model file adds only its path)."""
        base = {(o.long_name, v) for o, v in base_preset(self.settings).options}
        out: dict[str, list[str]] = {}
        for entry in catalog:
            if any(
                (o.long_name, v) not in base and o.env not in _PATH_ENVS
                for o, v in entry.preset.options
            ):
                out[entry.name] = self.render_args_of(catalog, entry, 0)
        return out

    def scan(self) -> PreparedCatalog:
        """Re-read every model source (a reload's first step); ConfigError when one is broken."""
        catalog = build_catalog(
            self.settings,
            self.table,
            self.environ,
            self.cwd,
            reload=True,
            probe=self.facts.architecture,
        )
        return self.prepare(catalog)

    def model_configs(self, catalog: Catalog) -> list[ModelConfig]:
        configs = []
        for e in catalog:
            args = catalog.child_args(e, 0, bin_path=str(self.engine.path))
            fp = fingerprint(self._layout(e, args))
            need = self.observed.get(e.name, fp) or estimated_need(
                e, self.facts, self.gpus, kv_store=self._kv(e) is not None
            )
            configs.append(
                ModelConfig(
                    name=e.name,
                    pin=e.pin,
                    ttl=float(e.ttl) if e.ttl else None,  # ttl = 0: never
                    fingerprint=fp,
                    need=need,
                    cpu=cpu_request(e.preset.get_spelling),
                    gpu=self._gpu_request(e),
                    layers=self._layers(e),
                    restart_key=RestartKey(*restart_key(e.preset)),
                )
            )
        return configs

    def _gpu_request(self, entry: ModelEntry) -> GpuRequest | None:
        """The model's own device flags, when troupe places children on GPUs."""
        if not self.gpu_ids:
            return None
        return gpu_request(entry.preset.get_spelling, self.device_names)

    def _layers(self, entry: ModelEntry) -> int | None:
        """Its layers as the engine counts offload (the output layer too)."""
        if not self.gpu_ids or entry.model_path is None:
            return None
        facts = self.facts.facts(entry.model_path)
        return facts.n_layer + 1 if isinstance(facts, ModelFacts) and facts.n_layer else None

    def remove_files(self, model: str) -> bool:
        return remove_cached(cache_dir(self.environ), model)

    def remember_memory(self, model: str, used: Mapping[str, int]) -> None:
        entry = self.catalog.get(model)
        if entry is not None:
            args = self.catalog.child_args(entry, 0, bin_path=str(self.engine.path))
            fp = fingerprint(self._layout(entry, args))
            self.observed.put(model, fp, used)

    # ----- children ------------------------------------------------------------------------

    def launch_spec(
        self, model: str, cpu: CpuPlan | None = None, gpu: GpuPlan | None = None
    ) -> LaunchSpec:
        """How to start ``model``'s child (on lane ``cpu`` and GPUs ``gpu`` when troupe
        places it)."""
        entry = self.catalog.get(model)
        if entry is None:
            raise ConfigError(f"model {model} is not in the catalog")
        env = dict(self.environ)
        env.update(self.catalog.child_env(entry))  # its secrets: never on its command line
        if len(self.settings.api_keys) > 1 or self.settings.tenants_file is not None:
            # Several tenants: the engine would put every slot's prompt and generated
            # text in its GET /slots answer (troupe.http.slot_routes).
            env.pop("LLAMA_SERVER_SLOTS_DEBUG", None)
        # The configured port, even 0 (upstream); its presence is what makes a child a child.
        env["LLAMA_SERVER_ROUTER_PORT"] = str(self.settings.port)
        if self.gpu_ids:
            # CUDA numbers the cards as NVML does (PCI bus order), not fastest first.
            env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")

        kv = self._kv(entry)

        def argv(port: int) -> list[str]:
            args = self.render_args(entry, port)
            if cpu is not None:
                args += cpu_flags(cpu, lambda flag: entry.preset.get_spelling(flag) is not None)
            if kv is not None:
                args = kv.launch_args(model, args, self._uses_swa(entry))
            elif self.kv is not None:  # no files (kv-store off): several tenants, steered
                args = self.kv.launch_args(model, args, self._uses_swa(entry), files=False)
            if gpu is not None:
                # After the KV store's: its identity of the child stays the same whichever
                # cards it runs on (a slot saved on one card restores on another).
                args += gpu_flags(
                    gpu, self.gpu_ids, lambda flag: entry.preset.get_spelling(flag) is not None
                )
            self._last_args[model] = args
            return args

        async def save_slots(gen: int) -> None:
            assert kv is not None
            await kv.save_slots(model, gen)  # its owner's, for that child generation

        return LaunchSpec(
            model=model,
            argv=argv,
            env=env,
            stop_timeout=float(entry.stop_timeout),
            term_grace=entry.term_grace,
            cwd=self.catalog.cwd,
            load_timeout=self.settings.load_timeout,
            log_sink=self.logs.writer(model),
            cpus=cpu.cpus if cpu is not None else None,
            before_stop=save_slots if kv is not None else None,
            before_stop_seconds=kv.save_seconds if kv is not None else 10.0,
            model_file=entry.model_path,
            device_names=self.device_names,
        )

    def measure_command(self, model: str) -> tuple[list[str], dict[str, str]]:
        entry = self.catalog.get(model)
        if entry is None:
            raise ConfigError(f"model {model} is not in the catalog")
        swa_full = kv_swa_full(entry, self.facts, self._kv(entry) is not None)
        args = projection_argv(self.catalog, entry, str(self.engine.path), self.environ, swa_full)
        env = {**self.environ, **self.catalog.child_env(entry)}
        if self.gpu_ids:
            env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # its rows name cards as NVML
        return args, env

    def _layout(self, entry: ModelEntry, args: list[str]) -> list[str]:
        """``args`` with what the KV store adds to the KV layout (``--swa-full``): memory
        measured or seen under one layout does not hold for the other."""
        return KvService.measure_args(args, self._uses_swa(entry)) if self._kv(entry) else args

    def _kv(self, entry: ModelEntry) -> KvService | None:
        """The KV store with its files, unless ``--kv-store off`` or the model's preset has
        ``kv-store = off``."""
        kv = self.kv
        return kv if entry.kv_store and kv is not None and kv.store is not None else None

    def _uses_swa(self, entry: ModelEntry) -> bool:
        """Sliding-window attention: a restored slot is reused only with --swa-full."""
        if entry.model_path is None:
            return False
        facts = self.facts.facts(entry.model_path)
        return isinstance(facts, ModelFacts) and facts.swa_window > 0

    def render_args(self, entry: ModelEntry, port: int) -> list[str]:
        return self.render_args_of(self.catalog, entry, port)

    def render_args_of(self, catalog: Catalog, entry: ModelEntry, port: int) -> list[str]:
        return catalog.child_args(
            entry,
            port,
            bin_path=str(self.engine.path),
            app_cmd=self.environ.get("LLAMA_APP_CMD", ""),
        )

    def status_args(self, entry: ModelEntry) -> list[str]:
        return self._last_args.get(entry.name) or self.render_args(entry, 0)
