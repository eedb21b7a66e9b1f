"""The router config file (``--config troupe.toml``), for deployments.

Every router setting of the command line has a key here; precedence is default <
config file < environment < command line, as llama-server's own config.ini. The file
is structured with cattrs so a mistake names the key's path and what was expected::

    [server]   host, port, api_prefix, timeout, api_keys, api_key_file, ssl_key_file,
               ssl_cert_file, cors_origins, cors_methods, cors_headers, cors_credentials
    [models]   dir, preset, max, autoload, sleep_idle_seconds, memory_margin_mib
    [troupe]   engine, log_level, log_format, state_dir, max_body_mib, ws_max_message_mib,
               queue_max, queue_timeout, load_timeout, drain_timeout, drain_after,
               cpu_placement, kv_store, kv_store_mib
               queue_max, queue_timeout, load_timeout, drain_timeout, cluster_nodes
    [child]    any llama-server option, forwarded to every child ("ctx-size" = 4096)
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import cattrs

from troupe.errors import ConfigError
from troupe.settings.options import EngineOption, OptionTable
from troupe.settings.router import TROUPE_OPTIONS

__all__ = ["RouterConfig", "config_options", "load_config"]

Scalar = str | int | float | bool


@attrs.frozen
class ServerSection:
    host: str | list[str] | None = None
    port: int | None = None
    api_prefix: str | None = None
    timeout: int | None = None
    api_keys: list[str] | None = None
    api_key_file: str | None = None
    ssl_key_file: str | None = None
    ssl_cert_file: str | None = None
    cors_origins: str | None = None
    cors_methods: str | None = None
    cors_headers: str | None = None
    cors_credentials: bool | None = None


@attrs.frozen
class ModelsSection:
    dir: str | None = None
    preset: str | None = None
    max: int | None = None
    autoload: bool | None = None
    sleep_idle_seconds: int | None = None
    memory_margin_mib: int | str | None = None


@attrs.frozen
class TroupeSection:
    engine: str | None = None
    log_level: str | None = None
    log_format: str | None = None
    state_dir: str | None = None
    max_body_mib: int | None = None
    ws_max_message_mib: int | None = None
    queue_max: int | None = None
    queue_timeout: float | None = None
    load_timeout: float | str | None = None
    drain_timeout: float | None = None
    drain_after: float | str | None = None
    cpu_placement: str | None = None
    access_log: str | None = None  # "on" or "off"
    named_api_keys: str | None = None
    allowed_hosts: str | None = None
    body_timeout: float | None = None
    max_connections: int | None = None
    max_connections_per_client: int | None = None
    body_min_rate: int | None = None
    body_rate_grace: float | None = None
    ws_idle_timeout: float | None = None
    kv_store: str | None = None
    kv_store_mib: int | None = None
    cluster_nodes: list[str] | str | None = None  # URLs, or the path of a file of them


@attrs.frozen
class RouterConfig:
    server: ServerSection = ServerSection()
    models: ModelsSection = ModelsSection()
    troupe: TroupeSection = TroupeSection()
    child: dict[str, Scalar] = attrs.field(factory=dict)


# Which command-line spelling each key stands for.
_SERVER = {
    "host": "--host",
    "port": "--port",
    "api_prefix": "--api-prefix",
    "timeout": "--timeout",
    "api_keys": "--api-key",
    "api_key_file": "--api-key-file",
    "ssl_key_file": "--ssl-key-file",
    "ssl_cert_file": "--ssl-cert-file",
    "cors_origins": "--cors-origins",
    "cors_methods": "--cors-methods",
    "cors_headers": "--cors-headers",
    "cors_credentials": "--cors-credentials",
}
_MODELS = {
    "dir": "--models-dir",
    "preset": "--models-preset",
    "max": "--models-max",
    "autoload": "--models-autoload",
    "sleep_idle_seconds": "--sleep-idle-seconds",
}
_MODELS_OWN = {"memory_margin_mib": "--models-memory-margin"}
_TROUPE = {
    "engine": "--engine",
    "log_level": "--log-level",
    "log_format": "--log-format",
    "state_dir": "--state-dir",
    "max_body_mib": "--max-body-mib",
    "ws_max_message_mib": "--ws-max-message-mib",
    "queue_max": "--queue-max",
    "queue_timeout": "--queue-timeout",
    "load_timeout": "--load-timeout",
    "drain_timeout": "--drain-timeout",
    "drain_after": "--drain-after",
    "cpu_placement": "--cpu-placement",
    "access_log": "--access-log",
    "named_api_keys": "--named-api-keys",
    "allowed_hosts": "--allowed-hosts",
    "body_timeout": "--body-timeout",
    "max_connections": "--max-connections",
    "max_connections_per_client": "--max-connections-per-client",
    "body_min_rate": "--body-min-rate",
    "body_rate_grace": "--body-rate-grace",
    "ws_idle_timeout": "--ws-idle-timeout",
    "kv_store": "--kv-store",
    "kv_store_mib": "--kv-store-mib",
    "cluster_nodes": "--cluster-nodes",
}


def _converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True)

    def scalar(value: Any, _: type) -> Scalar:
        if isinstance(value, bool | int | float | str):
            return value
        raise TypeError(f"expected a string, number or boolean, got {type(value).__name__}")

    conv.register_structure_hook(Scalar, scalar)

    def host(value: Any, _: type) -> str | list[str] | None:
        if isinstance(value, str) or (
            isinstance(value, list) and all(isinstance(v, str) for v in value)
        ):
            return value
        raise TypeError("expected a string or a list of strings")

    conv.register_structure_hook(str | list[str] | None, host)

    def int_or_text(value: Any, _: type) -> int | str | None:
        if isinstance(value, int | str) and not isinstance(value, bool):
            return value
        raise TypeError('expected a number of MiB or "off"')

    conv.register_structure_hook(int | str | None, int_or_text)

    def seconds_or_off(value: Any, _: type) -> float | str | None:
        if isinstance(value, int | float | str) and not isinstance(value, bool):
            return value
        raise TypeError('expected a number of seconds or "off"')

    conv.register_structure_hook(float | str | None, seconds_or_off)
    return conv


def load_config(path: Path) -> RouterConfig:
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    try:
        return _converter().structure(raw, RouterConfig)
    except cattrs.BaseValidationError as exc:
        problems = "; ".join(cattrs.transform_error(exc, path="config"))
        raise ConfigError(f"config file {path}: {problems}") from None


def _text(value: Scalar | list[str]) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, list):
        return ",".join(value)
    return str(value)


def config_options(
    cfg: RouterConfig, table: OptionTable, base: Path
) -> tuple[dict[EngineOption, str], dict[EngineOption, str]]:
    """The file as parsed command-line options: (llama-server options, troupe options).
    Relative paths are relative to the config file's directory."""
    engine_opts: dict[EngineOption, str] = {}
    own_table = OptionTable(TROUPE_OPTIONS)
    own_opts: dict[EngineOption, str] = {}

    def put(
        section: object,
        mapping: Mapping[str, str],
        target: dict[EngineOption, str],
        tab: OptionTable,
    ) -> None:
        for key, spelling in mapping.items():
            value = getattr(section, key)
            if value is None:
                continue
            found = tab.by_spelling(spelling)
            assert found is not None, spelling
            if key in (
                "dir",
                "preset",
                "api_key_file",
                "ssl_key_file",
                "ssl_cert_file",
                "engine",
                "state_dir",
            ):
                value = (
                    str((base / str(value)).resolve())
                    if not Path(str(value)).is_absolute()
                    else value
                )
            if key == "cluster_nodes" and isinstance(value, str) and "://" not in value:
                value = str((base / value).resolve())  # a node-list file, by the config's
            target[found[0]] = _text(value)

    put(cfg.server, _SERVER, engine_opts, table)
    put(cfg.models, _MODELS, engine_opts, table)
    put(cfg.models, _MODELS_OWN, own_opts, own_table)
    put(cfg.troupe, _TROUPE, own_opts, own_table)
    for key, value in cfg.child.items():
        found = table.by_key(key)
        if found is None:
            raise ConfigError(f"config file: [child] option '{key}' is not a llama-server option")
        opt, negated = found
        text = _text(value)
        if negated and not opt.takes_value:
            text = "0" if text in ("1", "true", "on") else "1"
        engine_opts[opt] = text
    return engine_opts, own_opts
