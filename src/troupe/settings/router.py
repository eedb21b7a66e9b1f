"""The router's own settings: llama-server's router flags plus troupe's additions.

Each setting is declared in ``troupe.settings.table`` (flag, environment name, config key,
parser, default, help); here they are read into `RouterSettings`. Precedence, as
upstream: built-in default < config file < environment (``LLAMA_ARG_*``) < command line.
The router flags are llama-server options too, so they also stay in the base preset that
is forwarded to children; the catalog strips the reserved ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import attrs

from troupe.errors import UsageError
from troupe.settings import table as T
from troupe.settings.options import EngineOption, OptionTable
from troupe.settings.table import SETTINGS, log_format

__all__ = [
    "ROUTER_OPTIONS",
    "TROUPE_OPTIONS",
    "RouterSettings",
    "build_settings",
    "log_format",
    "with_router_options",
]

ROUTER_OPTIONS: tuple[EngineOption, ...] = tuple(s.option for s in SETTINGS if not s.own)
"""llama-server's router flags. The engine's own --help is authoritative; these
fill in when an engine build lacks one, so the router never depends on a child's help."""

TROUPE_OPTIONS: tuple[EngineOption, ...] = tuple(s.option for s in SETTINGS if s.own)
"""troupe's own flags: never forwarded to children (llama-server would reject them)."""


def with_router_options(table: OptionTable) -> OptionTable:
    """The engine's table plus any router flag this engine build does not list."""
    missing = [o for o in ROUTER_OPTIONS if table.by_spelling(o.long_name) is None]
    return OptionTable(table.options + tuple(missing)) if missing else table


@attrs.frozen
class RouterSettings:
    """Everything the router itself needs to know; children get ``base_args``."""

    hosts: tuple[str, ...] = ("127.0.0.1",)
    port: int = 8080
    models_dir: Path | None = None
    models_preset: Path | None = None
    models_max: int = 4
    models_autoload: bool = True
    sleep_idle_seconds: int = -1
    api_keys: tuple[str, ...] = ()
    api_key_names: tuple[str, ...] = ()  # one per key, for logs ("" gives key-N)
    tenants_file: Path | None = None  # --tenants: read by troupe.tenants.file
    timeout: int = 3600
    ssl_key_file: Path | None = None
    ssl_cert_file: Path | None = None
    api_prefix: str = ""
    cors_origins: str = "*"
    cors_methods: str = "GET, POST, DELETE, OPTIONS"
    cors_headers: str = "*"
    cors_credentials: bool = True
    # Browser origins admitted at all (troupe.http.cors.OriginCheck) beside loopback ones
    # and the request's own host: an explicit --cors-origins list; ("*",): any.
    allowed_origins: tuple[str, ...] = ()
    offline: bool = False
    ui_config: Mapping[str, object] = attrs.field(factory=dict)
    ui_mcp_proxy: bool = False
    engine: str | None = None
    log_level: str = "info"
    log_format: str = "text"  # or "json": one object per line
    state_dir: Path | None = None  # PID ledger and measurements (default: XDG state dir)
    max_body_bytes: int = 128 << 20  # a proxied request body over this gets 413
    ws_max_message_bytes: int = 16 << 20  # WebSocket message limit, both directions
    queue_max: int = 0  # requests waiting for a model at once; 0: no limit
    queue_timeout: float | None = None  # longest wait for a model; None: no limit
    # A load that shows no progress (no output from its child) for this long is killed.
    load_timeout: float | None = 300.0
    drain_timeout: float = 30.0  # on SIGTERM, how long requests in flight may finish
    # A model that gets no slot because every loaded one is busy waits this long, then the
    # busy model with the least demand is drained for it; None ("off"): never, as upstream.
    drain_after: float | None = 1.0
    # "auto": each child gets threads and a CPU set of its own (troupe.sched.cpu); "off":
    # children take the engine's defaults, as llama.cpp's router.
    cpu_placement: str = "auto"
    gpu_placement: str = "auto"
    access_log: bool = False  # one log line per proxied request (troupe.ops.access)
    # A streamed request waiting for a load: "comments" (SSE comments with the progress),
    # "reasoning" (also reasoning_content deltas on chat completions), "off" (troupe.http.loading).
    load_progress: str = "comments"
    # "on": slots saved before troupe stops a child, restored when their conversation
    # returns (troupe.kvstore), at most kv_store_bytes on disk; "off": as llama.cpp.
    kv_store: str = "on"
    kv_store_bytes: int = 4096 << 20
    # Every node of a cluster behind one balancer (comma-separated URLs, or a file of
    # them, this node included); "": a single node (troupe.cluster).
    cluster_nodes: str = ""
    cluster_secret_file: str = ""  # the cluster secret's file ("": TROUPE_CLUSTER_SECRET)
    cluster_timeout: float = 5.0  # a node that answers no health check this long is hung
    cluster_copy_ttl: float = 300.0  # idle seconds before a failover/spill copy goes back
    cluster_agent_port: int = 0  # the HAProxy agent's port (0: any free one; -1: off)
    # Next nodes a saved KV slot is pushed to, and whether a miss asks the peers (0: off).
    cluster_kv_replicas: int = 1
    # Memory kept free on every device when admitting a model; None: no memory admission.
    memory_margin_bytes: int | None = 1024 << 20
    # Host names a loopback listener answers beside loopback ones (DNS rebinding);
    # ("*",): any.
    allowed_hosts: tuple[str, ...] = ()
    body_timeout: float = 300.0  # from a request's head to the end of its body
    max_connections: int = 1024  # open at once; past it 503 (GET /health has a reserve)
    # Open at once from one address (loopback and UNIX sockets not counted); 0: no cap.
    max_connections_per_client: int = 256
    body_min_rate: int = 500  # bytes a second a body must keep up after the grace; 0: off
    body_rate_grace: float = 10.0  # seconds after a head before the body's pace counts
    ws_idle_timeout: float = 300.0  # a WebSocket session the client says nothing on
    # Every llama-server option from the command line, forwarded to children (as upstream).
    base_args: tuple[tuple[EngineOption, str], ...] = ()


class _Lookup:
    """Reads one setting: command line, then its environment names, then the config file."""

    def __init__(
        self,
        table: OptionTable,
        cli: Mapping[EngineOption, str],
        environ: Mapping[str, str],
        config: Mapping[EngineOption, str] | None = None,
    ) -> None:
        self.table = table
        self.cli = cli
        self.environ = environ
        self.config = config or {}

    def get(self, spelling: str) -> tuple[str, str] | None:
        """``(source name, raw value)`` or None; flags read as "1"/"0"."""
        found = self.table.by_spelling(spelling)
        if found is None:
            return None
        opt = found[0]
        if opt in self.cli:
            return spelling, self.cli[opt]
        names = opt.env_names()
        if len(names) == 2 and names[1] in self.environ:
            return names[1], "0"  # LLAMA_ARG_NO_X (any value) means false
        if names and names[0] in self.environ:
            return names[0], self.environ[names[0]]
        if opt in self.config:
            return f"{spelling} (config file)", self.config[opt]
        return None


def _allowed_origins(get: _Lookup) -> tuple[str, ...]:
    """The origins an explicit ``--cors-origins`` lists (its default ``*`` is
    llama.cpp's CORS header, not a choice to let every web page drive troupe)."""
    got = T.CORS_ORIGINS.given(get)
    if got is None or got.text.strip().lower() == "localhost":
        return ()
    return tuple(o.strip() for o in got.text.split(",") if o.strip())


def _read_api_keys(path: Path) -> tuple[str, ...]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UsageError(f"cannot read --api-key-file '{path}': {exc.strerror or exc}") from None
    return tuple(ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#"))


def _read_named_keys(path: Path) -> tuple[tuple[str, str], ...]:
    """``name:key`` lines (``#`` comments, blank lines skipped)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UsageError(f"cannot read --named-api-keys '{path}': {exc.strerror or exc}") from None
    out = []
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        name, sep, key = text.partition(":")
        if not sep or not name.strip() or not key.strip():
            raise UsageError(f"{path}:{number}: expected 'name:key'")
        out.append((name.strip(), key.strip()))
    return tuple(out)


def build_settings(
    table: OptionTable,
    cli: Mapping[EngineOption, str],
    troupe_cli: Mapping[EngineOption, str],
    environ: Mapping[str, str],
    config: Mapping[EngineOption, str] | None = None,
    troupe_config: Mapping[EngineOption, str] | None = None,
) -> RouterSettings:
    """Resolve router settings: command line > environment > config file > default."""
    get = _Lookup(table, cli, environ, config)
    own = _Lookup(OptionTable(TROUPE_OPTIONS), troupe_cli, environ, troupe_config)

    sleep_idle = T.SLEEP_IDLE_SECONDS.read(get)
    port = T.PORT.read(get)

    keys = list(T.API_KEY.read(get))
    key_file = T.API_KEY_FILE.read(get)
    if key_file:
        keys += _read_api_keys(key_file)
    names = [""] * len(keys)
    named_file = T.NAMED_API_KEYS.read(own)
    if named_file:
        for name, key in _read_named_keys(named_file):
            keys.append(key)
            names.append(name)

    ui_config: Mapping[str, object] = {}
    ui_file = T.UI_CONFIG_FILE.read(get)
    if ui_file:
        try:
            text = ui_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(
                f"cannot read --ui-config-file '{ui_file}': {exc.strerror or exc}"
            ) from None
        ui_config = T.UI_CONFIG.parse(T.Raw(str(ui_file), T.UI_CONFIG.flag, text))
    raw_ui = T.UI_CONFIG.given(get)
    if raw_ui:
        ui_config = T.UI_CONFIG.parse(raw_ui)

    models_dir = T.MODELS_DIR.read(get)
    models_preset = T.MODELS_PRESET.read(get)
    hosts = T.HOST.read(get)
    return RouterSettings(
        hosts=hosts,
        port=port,
        models_dir=models_dir,
        models_preset=models_preset,
        models_max=T.MODELS_MAX.read(get),
        models_autoload=T.MODELS_AUTOLOAD.read(get),
        sleep_idle_seconds=sleep_idle,
        api_keys=tuple(keys),
        api_key_names=tuple(names),
        tenants_file=T.TENANTS.read(own),
        timeout=T.TIMEOUT.read(get),
        ssl_key_file=T.SSL_KEY_FILE.read(get),
        ssl_cert_file=T.SSL_CERT_FILE.read(get),
        api_prefix=T.API_PREFIX.read(get),
        cors_origins=T.CORS_ORIGINS.read(get),
        cors_methods=T.CORS_METHODS.read(get),
        cors_headers=T.CORS_HEADERS.read(get),
        cors_credentials=T.CORS_CREDENTIALS.read(get),
        allowed_origins=_allowed_origins(get),
        offline=T.OFFLINE.read(get),
        ui_config=ui_config,
        ui_mcp_proxy=T.UI_MCP_PROXY.read(get),
        engine=T.ENGINE.read(own),
        log_level=T.LOG_LEVEL.read(own),
        log_format=T.LOG_FORMAT.read(own),
        state_dir=T.STATE_DIR.read(own),
        max_body_bytes=T.MAX_BODY_MIB.read(own),
        ws_max_message_bytes=T.WS_MAX_MESSAGE_MIB.read(own),
        queue_max=T.QUEUE_MAX.read(own),
        queue_timeout=T.QUEUE_TIMEOUT.read(own),
        load_timeout=T.LOAD_TIMEOUT.read(own),
        drain_timeout=T.DRAIN_TIMEOUT.read(own),
        drain_after=T.DRAIN_AFTER.read(own),
        cpu_placement=T.CPU_PLACEMENT.read(own),
        gpu_placement=T.GPU_PLACEMENT.read(own),
        kv_store=T.KV_STORE.read(own),
        kv_store_bytes=T.KV_STORE_MIB.read(own),
        memory_margin_bytes=T.MODELS_MEMORY_MARGIN.read(own),
        access_log=T.ACCESS_LOG.read(own),
        load_progress=T.LOAD_PROGRESS.read(own),
        allowed_hosts=T.ALLOWED_HOSTS.read(own),
        body_timeout=T.BODY_TIMEOUT.read(own),
        max_connections=T.MAX_CONNECTIONS.read(own),
        max_connections_per_client=T.MAX_CONNECTIONS_PER_CLIENT.read(own),
        body_min_rate=T.BODY_MIN_RATE.read(own),
        body_rate_grace=T.BODY_RATE_GRACE.read(own),
        ws_idle_timeout=T.WS_IDLE_TIMEOUT.read(own),
        cluster_nodes=T.CLUSTER_NODES.read(own),
        cluster_secret_file=T.CLUSTER_SECRET_FILE.read(own),
        cluster_timeout=T.CLUSTER_TIMEOUT.read(own),
        cluster_copy_ttl=T.CLUSTER_COPY_TTL.read(own),
        cluster_agent_port=T.CLUSTER_AGENT_PORT.read(own),
        cluster_kv_replicas=T.CLUSTER_KV_REPLICAS.read(own),
        base_args=tuple({**(config or {}), **cli}.items()),
    )
