"""The composition root: `build_troupe` makes every part of one router; `Troupe` holds them.

`build_troupe` reads the catalog, the devices and the observed memory, and builds
the scheduler (core and actor, with `ChildSpecs` as its specs), the relay and
its pool, the metrics, the logs, the downloads and the conversation tracker. `Troupe`
is a plain container of those parts, handed to the servers: `troupe.http` serves from
it, `troupe.service` runs it (nursery, signals, shutdown order). Nothing here serves
or runs; the parts own their state (the scheduler its table), the router owns none.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
from pathlib import Path
from typing import Protocol

import attrs
import trio

from troupe.actors.memory import MemorySampler, ObservedStore, gpu_name
from troupe.actors.scheduler import Scheduler
from troupe.catalog import Catalog, ModelEntry, build_catalog, check_startup
from troupe.catalog.facts import FactsCache
from troupe.child.ledger import PidLedger, default_state_dir
from troupe.cluster import Cluster, NodeList
from troupe.cluster.kvsync import KvLink
from troupe.cluster.trust import ClusterTrust, read_secret
from troupe.conversations import ConversationTracker
from troupe.download.router import RouterDownloads
from troupe.engine import Engine
from troupe.errors import ConfigError
from troupe.hardware.cpus import read_topology
from troupe.hardware.devices import DeviceList, DeviceReader
from troupe.hardware.gpu_ids import engine_gpu_ids
from troupe.hardware.listdevices import DeviceListError, run_list_devices
from troupe.kvstore import KvService, KvStore
from troupe.kvstore.metrics import KvMetrics
from troupe.kvstore.replicas import Replicas
from troupe.kvstore.store import private_dir
from troupe.ops.access import RequestLog
from troupe.ops.history import History
from troupe.ops.live import LiveStreams
from troupe.ops.load_log import LoadLog
from troupe.ops.logs import ModelLogs
from troupe.ops.metrics import RouterMetrics
from troupe.proxy.relay import Relay
from troupe.sched import SchedulerCore
from troupe.sched.cpu import CpuLedger
from troupe.sched.memory import MemoryLedger
from troupe.settings.options import OptionTable
from troupe.settings.router import RouterSettings
from troupe.specs import ChildSpecs
from troupe.tenants.book import TenantBook, book_for
from troupe.tenants.model import Tenants
from troupe.tenants.usage import FILE_NAME as USAGE_FILE
from troupe.tenants.usage import Accounts

__all__ = ["FAKE_TIMING_ENV", "Drainable", "Troupe", "build_troupe"]

log = logging.getLogger("troupe.assembly")

FAKE_TIMING_ENV = "LLAMA_SERVER_DEBUG_FAKE_TIMING"


class Drainable(Protocol):
    """The running HTTP server, as the shutdown drives it (`troupe.http.HttpServer`)."""

    urls: list[str]

    def stop_accepting(self) -> None: ...

    def close_idle(self) -> None: ...

    async def drain(self, grace: float) -> None: ...


@attrs.define(eq=False)
class Troupe:
    """Settings and the running parts of one router, for the servers to use."""

    settings: RouterSettings
    engine: Engine
    scheduler: Scheduler
    specs: ChildSpecs
    relay: Relay  # the one transport to children
    metrics: RouterMetrics  # fed by the scheduler's listeners and the relay
    logs: ModelLogs  # every model's log, across its children
    downloads: RouterDownloads  # POST /models
    conversations: ConversationTracker  # X-Conversation-Id -> model (its tickets)
    devices: DeviceList  # totals for feasibility; free memory is sampled
    reader: DeviceReader
    kv: KvService | None = None  # the KV store (None: --kv-store off)
    fake_timing: bool = False
    requests: RequestLog = attrs.field(factory=RequestLog)  # recent requests, access log
    history: History = attrs.field(factory=History)  # the dashboard's recent samples
    streams: LiveStreams = attrs.field(factory=LiveStreams)  # streams relayed now (tokens/s)
    cluster: Cluster | None = None  # --cluster-nodes: the peers, and where models go
    tenants: TenantBook = attrs.field(factory=lambda: TenantBook(Tenants()))  # keys' tenants
    # Each tenant's budgets and usage (`troupe.tenants.usage`), saved in the state directory.
    accounts: Accounts = attrs.field(
        default=attrs.Factory(lambda self: Accounts(self.tenants), takes_self=True)
    )
    # The servers' side of the lifecycle: ready once listening; `http_stop` asks the
    # HTTP server to drain, `http_done` says it has; `http_server` is the drain's handle.
    ready: bool = False
    http_stop: trio.Event = attrs.field(factory=trio.Event)
    http_done: trio.Event = attrs.field(factory=trio.Event)
    http_server: Drainable | None = None

    @property
    def catalog(self) -> Catalog:
        """The catalog in effect (the scheduler's; replaced whole on reload)."""
        return self.scheduler.prepared.catalog

    @property
    def facts(self) -> FactsCache:
        return self.specs.facts

    def rejection(self, entry: ModelEntry) -> str | None:
        """Why ``entry`` cannot run as a text model (a CLIP projector file), or None.
        Worked out once per catalog: no file system access on the request path."""
        return self.scheduler.prepared.rejection(entry)

    def status_args(self, entry: ModelEntry) -> list[str]:
        """The child's command line as ``GET /models`` shows it (the last one rendered)."""
        return self.specs.status_args(entry)

    def close(self) -> None:
        self.reader.close()


def cpu_ledger(settings: RouterSettings) -> CpuLedger | None:
    """The CPU ledger children are placed by (None: --cpu-placement off, or no CPU set
    could be read)."""
    if settings.cpu_placement == "off":
        return None
    topology = read_topology()
    return CpuLedger(topology) if topology is not None else None


def gpu_ids(
    settings: RouterSettings, engine: Engine, devices: DeviceList, environ: dict[str, str]
) -> dict[str, str]:
    """--gpu-placement auto: troupe's GPU name -> the engine's device id, for the GPUs
    children are placed on (`troupe.hardware.gpu_ids`); empty without NVML GPUs (no
    engine run then: nothing changes for CPU users), with placement off, or when the
    engine cannot use them (a CPU build)."""
    if settings.gpu_placement == "off" or not devices.gpus:
        return {}
    env = {**environ, "CUDA_DEVICE_ORDER": environ.get("CUDA_DEVICE_ORDER", "PCI_BUS_ID")}

    def run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env=env, check=False
        )

    try:
        listed = run_list_devices(engine.path, run=run)
    except DeviceListError as exc:
        log.warning("GPU placement off: %s", exc)
        return {}
    ids = engine_gpu_ids(devices.gpus, listed, environ)
    if ids:
        log.info("GPU placement: %s", ", ".join(f"{k}={v}" for k, v in ids.items()))
    return ids


def build_troupe(
    settings: RouterSettings,
    engine: Engine,
    table: OptionTable,
    ledger: PidLedger | None,
    environ: dict[str, str] | None = None,
    cwd: Path | None = None,
    *,
    use_nvml: bool = True,
) -> Troupe:
    """Every part of a router for ``settings``; ConfigError when the catalog is broken."""
    env = dict(os.environ if environ is None else environ)
    tenants = book_for(settings, env)  # a bad tenants file: refused before anything starts
    facts = FactsCache(no_mmproj=_no_mmproj(settings))
    try:
        catalog = build_catalog(settings, table, env, cwd or Path.cwd(), probe=facts.architecture)
        check_startup(catalog, settings.models_max)
    except ConfigError as exc:
        raise ConfigError(f"failed to initialize router models: {exc}") from None
    for warning in catalog.warnings:
        log.warning("%s", warning)
    log.info("%d model%s in the catalog", len(catalog), "" if len(catalog) == 1 else "s")
    # Memory admission: devices read once for the estimates' layout, then sampled
    # whenever the scheduler needs a fresh reading.
    reader = DeviceReader("auto" if use_nvml else None)
    devices = reader.read()
    placed_on = gpu_ids(settings, engine, devices, env)
    state_dir = _state_dir(settings)
    logs = ModelLogs()
    metrics = RouterMetrics(settings.api_prefix)
    # One transport for every byte sent to a child (the relay, the KV store's calls, the
    # metrics scrape); the scheduler tells it when a child starts, stops and is gone, so
    # no connection to a dead child stays open or is reused, and no call meant for one
    # reaches the next child on its port.
    relay = Relay(float(settings.timeout), observe=metrics.observe_relay)
    kv = _kv_service(settings, state_dir, catalog, metrics, relay, tenants)
    specs = ChildSpecs(
        settings,
        engine,
        table,
        env,
        catalog.cwd,
        facts=facts,
        observed=ObservedStore(state_dir / "observed-memory.json"),
        logs=logs,
        gpus=tuple(gpu_name(g.index) for g in devices.gpus),
        kv=kv,
        gpu_ids=placed_on,
    )
    fake_timing = bool(env.get(FAKE_TIMING_ENV))
    margin = settings.memory_margin_bytes
    prepared = specs.prepare(catalog)
    core = SchedulerCore(
        prepared.configs,
        settings.models_max,
        fake_timing=fake_timing,
        queue_max=settings.queue_max,
        memory=MemoryLedger(margin, gpus=tuple(placed_on)) if margin is not None else None,
        drain_after=settings.drain_after,
        measure=True,  # the engine's own projection, for every model it can read
        cpu=cpu_ledger(settings),
    )
    token = next((v for o, v in settings.base_args if o.long_name == "--hf-token"), None)
    downloads = RouterDownloads(env, state_dir, token)
    scheduler = Scheduler(
        core,
        specs,
        prepared,
        ledger=ledger,
        sampler=MemorySampler(reader) if margin is not None else None,
        transport=relay,
        downloads=downloads,
    )
    specs.read_catalog_from(scheduler)
    scheduler.add_listener(metrics.on_event)
    requests = RequestLog(enabled=settings.access_log)
    requests.add_listener(metrics.observe_request)
    accounts = Accounts.load(tenants, state_dir / USAGE_FILE)
    requests.add_listener(accounts.on_record)  # settles reservations, counts usage
    scheduler.add_listener(logs.on_event)
    scheduler.add_listener(LoadLog(trio.current_time).on_event)  # "ready in N s" and why
    cluster = _cluster(settings, env)
    _kv_replicas(settings, kv, cluster)
    return Troupe(
        settings=settings,
        engine=engine,
        scheduler=scheduler,
        specs=specs,
        relay=relay,
        metrics=metrics,
        logs=logs,
        downloads=downloads,
        conversations=ConversationTracker(),
        devices=devices,
        reader=reader,
        kv=kv,
        fake_timing=fake_timing,
        requests=requests,
        cluster=cluster,
        tenants=tenants,
        accounts=accounts,
    )


def _state_dir(settings: RouterSettings) -> Path:
    """troupe's state directory (the KV store's files hold conversations): created 0700;
    troupe's default one made 0700 if it is not. A directory the user named keeps its
    mode (the store's ``kv`` inside it is 0700 whatever it is)."""
    if settings.state_dir is None:
        path = default_state_dir()
        with contextlib.suppress(OSError):  # unwritable: what needs it says so later
            private_dir(path)
        return path
    with contextlib.suppress(OSError):
        settings.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    return settings.state_dir


def _kv_service(
    settings: RouterSettings,
    state_dir: Path,
    catalog: Catalog,
    metrics: RouterMetrics,
    relay: Relay,
    tenants: TenantBook,
) -> KvService | None:
    """The KV store under ``state_dir``/kv: entries of a model no longer listed go.
    ``--kv-store off``: none, or with several keys one without files, that keeps each
    tenant's requests off the slots holding another's tokens (the engine alone reuses a
    slot's cached prompt for whoever sends a prompt like it)."""
    # Several keys, or a tenants file: tenants whose conversations never meet
    # (`troupe.http.keys`).
    private = len(settings.api_keys) > 1 or settings.tenants_file is not None
    if settings.kv_store == "off":
        return KvService(None, KvMetrics(), children=relay.pool, private=True) if private else None
    store = KvStore(state_dir / "kv", settings.kv_store_bytes)
    store.open()
    # Tenants kept apart or not: as the live book says (a replaced book changes it).
    kv = KvService(
        store,
        KvMetrics(metrics.registry),
        children=relay.pool,
        private=lambda: tenants.current.private,
    )
    kv.forget_models(e.name for e in catalog)
    return kv


def _cluster(settings: RouterSettings, env: dict[str, str]) -> Cluster | None:
    if not settings.cluster_nodes:
        return None  # one node: no peers, nothing on the request path
    key = settings.api_keys[0] if settings.api_keys else None
    secret = read_secret(settings.cluster_secret_file or None, env)
    if secret is None:
        log.warning(
            "no cluster secret (TROUPE_CLUSTER_SECRET or --cluster-secret-file): any client "
            "that reaches this node can mark a request as forwarded (x-troupe-forwarded)"
        )
    return Cluster(
        NodeList(settings.cluster_nodes),
        api_key=key,
        read_timeout=settings.timeout,
        trust=ClusterTrust(secret),
        health_within=settings.cluster_timeout,
    )


def _kv_replicas(settings: RouterSettings, kv: KvService | None, cluster: Cluster | None) -> None:
    """In a cluster with a secret, the KV store's saves go to the model's next nodes and
    its misses are asked of the peers (``--cluster-kv-replicas``, 0: off)."""
    if cluster is None or kv is None or kv.store is None or settings.cluster_kv_replicas <= 0:
        return
    if not cluster.trust.signed:
        log.warning("KV slots do not follow conversations between nodes: no cluster secret")
        return
    kv.replicas = Replicas(
        kv,
        KvLink(cluster, settings.cluster_kv_replicas),
        replicas=settings.cluster_kv_replicas,
        limit=min(settings.max_body_bytes, kv.store.budget),
        timeout=settings.cluster_timeout,
    )


def _no_mmproj(settings: RouterSettings) -> bool:
    """``--no-mmproj`` on the router command line hides projector modalities."""
    return any(
        opt.env == "LLAMA_ARG_MMPROJ_AUTO" and value == "0" for opt, value in settings.base_args
    )
