"""The router's own settings: llama-server's router flags plus troupe's additions.

Precedence, as upstream: built-in default < environment (``LLAMA_ARG_*``) < command
line. The router flags are llama-server options too, so they also stay in the base
preset that is forwarded to children; the catalogue strips the reserved ones.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import attrs

from troupe.errors import UsageError
from troupe.settings.options import EngineOption, OptionTable

__all__ = [
    "ROUTER_OPTIONS",
    "TROUPE_OPTIONS",
    "RouterSettings",
    "build_settings",
    "log_format",
    "with_router_options",
]

_TRUTHY = {"on", "enabled", "true", "1"}
_FALSEY = {"off", "disabled", "false", "0"}


def _opt(
    *spellings: str, hint: str | None = None, env: str | None = None, neg: tuple[str, ...] = ()
) -> EngineOption:
    return EngineOption(spellings=spellings, negatives=neg, hints=(hint,) if hint else (), env=env)


# llama-server's router flags (spec §1.2). The engine's own --help is authoritative; these
# fill in when an engine build lacks one, so the router never depends on a child's help.
ROUTER_OPTIONS: tuple[EngineOption, ...] = (
    _opt("--host", hint="HOST", env="LLAMA_ARG_HOST"),
    _opt("--port", hint="PORT", env="LLAMA_ARG_PORT"),
    _opt("--models-dir", hint="PATH", env="LLAMA_ARG_MODELS_DIR"),
    _opt("--models-preset", hint="PATH", env="LLAMA_ARG_MODELS_PRESET"),
    _opt("--models-max", hint="N", env="LLAMA_ARG_MODELS_MAX"),
    _opt("--models-autoload", env="LLAMA_ARG_MODELS_AUTOLOAD", neg=("--no-models-autoload",)),
    _opt("--sleep-idle-seconds", hint="SECONDS"),
    _opt("--api-key", hint="KEY", env="LLAMA_API_KEY"),
    _opt("--api-key-file", hint="FNAME", env="LLAMA_ARG_API_KEY_FILE"),
    _opt("-to", "--timeout", hint="N", env="LLAMA_ARG_TIMEOUT"),
    _opt("--ssl-key-file", hint="FNAME", env="LLAMA_ARG_SSL_KEY_FILE"),
    _opt("--ssl-cert-file", hint="FNAME", env="LLAMA_ARG_SSL_CERT_FILE"),
    _opt("--api-prefix", hint="PREFIX", env="LLAMA_ARG_API_PREFIX"),
    _opt("--cors-origins", hint="ORIGINS", env="LLAMA_ARG_CORS_ORIGINS"),
    _opt("--cors-methods", hint="METHODS", env="LLAMA_ARG_CORS_METHODS"),
    _opt("--cors-headers", hint="HEADERS", env="LLAMA_ARG_CORS_HEADERS"),
    _opt("--cors-credentials", env="LLAMA_ARG_CORS_CREDENTIALS", neg=("--no-cors-credentials",)),
    _opt("--threads-http", hint="N", env="LLAMA_ARG_THREADS_HTTP"),
    _opt("--offline", env="LLAMA_ARG_OFFLINE"),
    _opt("--ui-config", "--webui-config", hint="JSON", env="LLAMA_ARG_UI_CONFIG"),
    _opt("--ui-config-file", "--webui-config-file", hint="PATH", env="LLAMA_ARG_UI_CONFIG_FILE"),
    _opt(
        "--ui-mcp-proxy",
        "--webui-mcp-proxy",
        env="LLAMA_ARG_UI_MCP_PROXY",
        neg=("--no-ui-mcp-proxy", "--no-webui-mcp-proxy"),
    ),
)

# troupe's own flags: never forwarded to children (llama-server would reject them).
TROUPE_OPTIONS: tuple[EngineOption, ...] = (
    _opt("--engine", hint="PATH", env="TROUPE_ENGINE"),
    _opt("--config", hint="PATH", env="TROUPE_CONFIG"),
    _opt("--log-level", hint="LEVEL", env="TROUPE_LOG_LEVEL"),
    _opt("--log-format", hint="FORMAT", env="TROUPE_LOG_FORMAT"),
    _opt("--state-dir", hint="PATH", env="TROUPE_STATE_DIR"),
    _opt("--max-body-mib", hint="N", env="TROUPE_MAX_BODY_MIB"),
    _opt("--queue-max", hint="N", env="TROUPE_QUEUE_MAX"),
    _opt("--models-memory-margin", hint="MIB", env="TROUPE_MODELS_MEMORY_MARGIN"),
    _opt("--queue-timeout", hint="SECONDS", env="TROUPE_QUEUE_TIMEOUT"),
    _opt("--ws-max-message-mib", hint="N", env="TROUPE_WS_MAX_MESSAGE_MIB"),
    _opt("--load-timeout", hint="SECONDS", env="TROUPE_LOAD_TIMEOUT"),
    _opt("--drain-timeout", hint="SECONDS", env="TROUPE_DRAIN_TIMEOUT"),
    _opt("--drain-after", hint="SECONDS", env="TROUPE_DRAIN_AFTER"),
    _opt("--cpu-placement", hint="auto|off", env="TROUPE_CPU_PLACEMENT"),
    _opt("--access-log", hint="on|off", env="TROUPE_ACCESS_LOG"),
    _opt("--named-api-keys", hint="PATH", env="TROUPE_NAMED_API_KEYS"),
    _opt("--allowed-hosts", hint="HOSTS", env="TROUPE_ALLOWED_HOSTS"),
    _opt("--body-timeout", hint="SECONDS", env="TROUPE_BODY_TIMEOUT"),
    _opt("--max-connections", hint="N", env="TROUPE_MAX_CONNECTIONS"),
    _opt("--max-connections-per-client", hint="N", env="TROUPE_MAX_CONNECTIONS_PER_CLIENT"),
    _opt("--body-min-rate", hint="BYTES", env="TROUPE_BODY_MIN_RATE"),
    _opt("--body-rate-grace", hint="SECONDS", env="TROUPE_BODY_RATE_GRACE"),
    _opt("--ws-idle-timeout", hint="SECONDS", env="TROUPE_WS_IDLE_TIMEOUT"),
    _opt("--kv-store", hint="on|off", env="TROUPE_KV_STORE"),
    _opt("--kv-store-mib", hint="N", env="TROUPE_KV_STORE_MIB"),
    _opt("--cluster-nodes", hint="URLS|FILE", env="TROUPE_CLUSTER_NODES"),
)


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
    access_log: bool = False  # one log line per proxied request (troupe.ops.access)
    # "on": slots saved before troupe stops a child, restored when their conversation
    # returns (troupe.kvstore), at most kv_store_bytes on disk; "off": as llama.cpp.
    kv_store: str = "on"
    kv_store_bytes: int = 4096 << 20
    # Every node of a cluster behind one balancer (comma-separated URLs, or a file of
    # them, this node included); "": a single node (troupe.cluster).
    cluster_nodes: str = ""
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
    # Every llama-server option from the command line, forwarded to children (spec §2.5).
    base_args: tuple[tuple[EngineOption, str], ...] = ()


CPU_PLACEMENTS = ("auto", "off")
KV_STORE_MODES = ("on", "off")


def _choice(flag: str, value: str, choices: tuple[str, ...]) -> str:
    v = value.strip().lower()
    if v not in choices:
        raise UsageError(f"invalid value for {flag}: '{value}' ({', '.join(choices)})")
    return v


def _parse_bool(name: str, value: str) -> bool:
    v = value.strip().lower()
    if v in _TRUTHY:
        return True
    if v in _FALSEY:
        return False
    raise UsageError(f"invalid value for {name}: '{value}' (expected true or false)")


def _parse_int(name: str, value: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise UsageError(f"invalid value for {name}: '{value}' (expected an integer)") from None


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

    def text(self, spelling: str, default: str) -> str:
        got = self.get(spelling)
        return default if got is None else got[1]

    def integer(self, spelling: str, default: int) -> int:
        got = self.get(spelling)
        return default if got is None else _parse_int(got[0], got[1])

    def boolean(self, spelling: str, default: bool) -> bool:
        got = self.get(spelling)
        return default if got is None else _parse_bool(got[0], got[1])

    def path(self, spelling: str) -> Path | None:
        got = self.get(spelling)
        return Path(got[1]).expanduser() if got and got[1] else None


def _mib(get: _Lookup, spelling: str, default: int) -> int:
    value = get.integer(spelling, default)
    if value <= 0:
        raise UsageError(
            f"invalid value for {spelling}: {value} (expected a positive number of MiB)"
        )
    return value << 20


def _non_negative(value: int, spelling: str) -> int:
    if value < 0:
        raise UsageError(f"invalid value for {spelling}: {value} (expected 0 or more)")
    return value


def _allowed_origins(get: _Lookup) -> tuple[str, ...]:
    """The origins an explicit ``--cors-origins`` lists (its default ``*`` is
    llama.cpp's CORS header, not a choice to let every web page drive troupe)."""
    got = get.get("--cors-origins")
    if got is None or got[1].strip().lower() == "localhost":
        return ()
    return tuple(o.strip() for o in got[1].split(",") if o.strip())


def log_format(text: str) -> str:
    value = text.strip().lower()
    if value not in ("text", "json"):
        raise UsageError(f"invalid value for --log-format: '{text}' (text or json)")
    return value


def _margin(text: str) -> int | None:
    if text.strip().lower() == "off":
        return None
    try:
        mib = int(text)
    except ValueError:
        raise UsageError(
            f"invalid value for --models-memory-margin: '{text}' (MiB, or off)"
        ) from None
    if mib < 0:
        raise UsageError(f"invalid value for --models-memory-margin: {mib} (MiB >= 0, or off)")
    return mib << 20


def _timeout(text: str) -> float | None:
    if not text.strip():
        return None
    try:
        seconds = float(text)
    except ValueError:
        raise UsageError(
            f"invalid value for --queue-timeout: '{text}' (expected seconds)"
        ) from None
    if not seconds > 0:
        raise UsageError(f"invalid value for --queue-timeout: '{text}' (expected seconds > 0)")
    return seconds


def _seconds(spelling: str, text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise UsageError(f"invalid value for {spelling}: '{text}' (expected seconds)") from None
    if not 0 < seconds < float("inf"):
        raise UsageError(f"invalid value for {spelling}: '{text}' (expected seconds > 0)")
    return seconds


def _seconds_or_off(spelling: str, text: str) -> float | None:
    return None if text.strip().lower() == "off" else _seconds(spelling, text)


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


def _positive_int(spelling: str, value: int) -> int:
    if value <= 0:
        raise UsageError(f"invalid value for {spelling}: {value} (expected 1 or more)")
    return value


def _parse_ui_config(source: str, raw: str) -> Mapping[str, object]:
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise UsageError(f"invalid JSON in {source}: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError(f"{source} must be a JSON object")
    return value


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

    sleep_idle = get.integer("--sleep-idle-seconds", -1)
    if sleep_idle == 0 or sleep_idle < -1:
        raise UsageError("invalid value for --sleep-idle-seconds: cannot be 0 or less than -1")
    port = get.integer("--port", 8080)
    if not 0 <= port <= 65535:
        raise UsageError(f"invalid value for --port: {port} (expected 0-65535)")

    keys: list[str] = []
    raw_keys = get.get("--api-key")
    if raw_keys:
        keys += [k.strip() for k in raw_keys[1].split(",") if k.strip()]
    key_file = get.path("--api-key-file")
    if key_file:
        keys += _read_api_keys(key_file)
    names = [""] * len(keys)
    named_file = own.path("--named-api-keys")
    if named_file:
        for name, key in _read_named_keys(named_file):
            keys.append(key)
            names.append(name)

    ui_config: Mapping[str, object] = {}
    ui_file = get.path("--ui-config-file")
    if ui_file:
        try:
            ui_config = _parse_ui_config(str(ui_file), ui_file.read_text(encoding="utf-8"))
        except OSError as exc:
            raise UsageError(
                f"cannot read --ui-config-file '{ui_file}': {exc.strerror or exc}"
            ) from None
    raw_ui = get.get("--ui-config")
    if raw_ui:
        ui_config = _parse_ui_config(raw_ui[0], raw_ui[1])

    models_dir = get.path("--models-dir")
    if models_dir is not None and not models_dir.is_dir():
        raise UsageError(f"'{models_dir}' does not exist or is not a directory")
    models_preset = get.path("--models-preset")
    if models_preset is not None and not models_preset.is_file():
        raise UsageError(f"preset file does not exist: {models_preset}")

    hosts = tuple(h.strip() for h in get.text("--host", "127.0.0.1").split(",") if h.strip())
    return RouterSettings(
        hosts=hosts or ("127.0.0.1",),
        port=port,
        models_dir=models_dir,
        models_preset=models_preset,
        models_max=get.integer("--models-max", 4),
        models_autoload=get.boolean("--models-autoload", True),
        sleep_idle_seconds=sleep_idle,
        api_keys=tuple(keys),
        api_key_names=tuple(names),
        timeout=get.integer("--timeout", 3600),
        ssl_key_file=get.path("--ssl-key-file"),
        ssl_cert_file=get.path("--ssl-cert-file"),
        api_prefix=get.text("--api-prefix", ""),
        cors_origins=get.text("--cors-origins", "*"),
        cors_methods=get.text("--cors-methods", "GET, POST, DELETE, OPTIONS"),
        cors_headers=get.text("--cors-headers", "*"),
        cors_credentials=get.boolean("--cors-credentials", True),
        allowed_origins=_allowed_origins(get),
        offline=get.boolean("--offline", False),
        ui_config=ui_config,
        ui_mcp_proxy=get.boolean("--ui-mcp-proxy", False),
        engine=own.text("--engine", "") or None,
        log_level=own.text("--log-level", "info"),
        log_format=log_format(own.text("--log-format", "text")),
        state_dir=own.path("--state-dir"),
        max_body_bytes=_mib(own, "--max-body-mib", 128),
        ws_max_message_bytes=_mib(own, "--ws-max-message-mib", 16),
        queue_max=_non_negative(own.integer("--queue-max", 0), "--queue-max"),
        queue_timeout=_timeout(own.text("--queue-timeout", "")),
        load_timeout=_seconds_or_off("--load-timeout", own.text("--load-timeout", "300")),
        drain_timeout=_seconds("--drain-timeout", own.text("--drain-timeout", "30")),
        drain_after=_seconds_or_off("--drain-after", own.text("--drain-after", "1")),
        cpu_placement=_choice(
            "--cpu-placement", own.text("--cpu-placement", "auto"), CPU_PLACEMENTS
        ),
        kv_store=_choice("--kv-store", own.text("--kv-store", "on"), KV_STORE_MODES),
        kv_store_bytes=_mib(own, "--kv-store-mib", 4096),
        memory_margin_bytes=_margin(own.text("--models-memory-margin", "1024")),
        access_log=_choice("--access-log", own.text("--access-log", "off"), ("on", "off")) == "on",
        allowed_hosts=tuple(
            h.strip().lower() for h in own.text("--allowed-hosts", "").split(",") if h.strip()
        ),
        body_timeout=_seconds("--body-timeout", own.text("--body-timeout", "300")),
        max_connections=_positive_int("--max-connections", own.integer("--max-connections", 1024)),
        max_connections_per_client=_non_negative(
            own.integer("--max-connections-per-client", 256), "--max-connections-per-client"
        ),
        body_min_rate=_non_negative(own.integer("--body-min-rate", 500), "--body-min-rate"),
        body_rate_grace=_seconds("--body-rate-grace", own.text("--body-rate-grace", "10")),
        ws_idle_timeout=_seconds("--ws-idle-timeout", own.text("--ws-idle-timeout", "300")),
        cluster_nodes=own.text("--cluster-nodes", "").strip(),
        base_args=tuple({**(config or {}), **cli}.items()),
    )
