"""The router config file (``--config troupe.toml``), for deployments.

Every router setting of the command line has a key here (``troupe.settings.table``
declares which, and its TOML type); precedence is default < config file < environment <
command line, as llama-server's own config.ini. The file is structured with cattrs so a
mistake names the key's path and what was expected::

    [server]   the listener, keys and CORS (host, port, api_keys, ...)
    [models]   dir, preset, max, autoload, sleep_idle_seconds, memory_margin_mib
    [troupe]   troupe's own settings (log_level, queue_max, kv_store, ...)
    [child]    any llama-server option, forwarded to every child ("ctx-size" = 4096)
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Callable
from pathlib import Path
from types import UnionType
from typing import Any, cast

import attrs
import cattrs
from cattrs.v import format_exception

from troupe.errors import ConfigError
from troupe.settings.options import EngineOption, OptionTable
from troupe.settings.router import TROUPE_OPTIONS
from troupe.settings.table import SETTINGS, Section, Setting

__all__ = ["RouterConfig", "config_options", "load_config"]

Scalar = str | int | float | bool
TomlValue = Scalar | list[str]

_SECTIONS: tuple[Section, ...] = ("server", "models", "troupe")


def _optional(kind: type | UnionType) -> type:
    # attrs takes any annotation at run time (its stubs say type); cattrs reads it, and
    # names it in errors ("expected int | None").
    return cast(type, kind | None)


def _section_class(section: Section) -> type:
    """The attrs class cattrs structures ``[section]`` into: one optional field per key."""
    fields = {
        s.toml.key: attrs.field(type=_optional(s.toml.type), default=None)
        for s in SETTINGS
        if s.toml is not None and s.toml.section == section
    }
    return attrs.make_class(f"{section.title()}Section", fields, frozen=True)


def _file_class() -> type:
    """The whole file: the three sections, then [child]."""
    fields: dict[str, Any] = {}
    for section in _SECTIONS:
        cls = _section_class(section)
        fields[section] = attrs.field(type=cls, factory=cls)
    fields["child"] = attrs.field(type=dict[str, Scalar], factory=dict)
    return attrs.make_class("ConfigFile", fields, frozen=True)


_FILE = _file_class()


@attrs.frozen
class RouterConfig:
    """A config file as read: each key given (``(section, key)`` -> value), and [child]."""

    values: dict[tuple[Section, str], TomlValue] = attrs.field(factory=dict)
    child: dict[str, Scalar] = attrs.field(factory=dict)

    def get(self, setting: Setting[object]) -> TomlValue | None:
        """The value the file gives ``setting``, or None."""
        toml = setting.toml
        return None if toml is None else self.values.get((toml.section, toml.key))


def _given(parsed: object) -> RouterConfig:
    values: dict[tuple[Section, str], TomlValue] = {}
    for setting in SETTINGS:
        if setting.toml is not None:
            section, key = setting.toml.section, setting.toml.key
            value: object = getattr(getattr(parsed, section), key)
            if isinstance(value, bool | int | float | str | list):
                values[(section, key)] = value
    child: dict[str, Scalar] = getattr(parsed, "child")  # noqa: B009  (a generated class)
    return RouterConfig(values, child)


class _Expected(TypeError):
    """A value of the wrong type, with what was expected and what came (the whole message)."""


def _shown(value: object) -> str:
    """A TOML value as its file spells it, for an error message."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return repr(value)


def _expected(what: str, value: object) -> _Expected:
    return _Expected(f"expected {what}, got {_shown(value)}")


def _format(exc: BaseException, kind: type | None) -> str:
    if isinstance(exc, _Expected):
        return str(exc)
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        extra = sorted(exc.extra_fields)
        return f"unknown key{'s' if len(extra) > 1 else ''} {', '.join(extra)}"
    return format_exception(exc, kind)


def _is(kind: Any) -> Callable[[Any], bool]:
    """Whether a field's type is ``kind`` or ``kind | None``."""
    return lambda t: t in (kind, _optional(kind))


def _converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True)

    def scalar(value: Any, _: type) -> Scalar:
        if isinstance(value, bool | int | float | str):
            return value
        raise _expected("a string, number or boolean", value)

    conv.register_structure_hook(Scalar, scalar)

    def integer(value: Any, _: type) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _expected("an integer", value)

    def number(value: Any, _: type) -> float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
        raise _expected("a number", value)

    def string(value: Any, _: type) -> str:
        if isinstance(value, str):
            return value
        raise _expected("a string", value)

    def boolean(value: Any, _: type) -> bool:
        if isinstance(value, bool):
            return value
        raise _expected("true or false", value)

    def strings(value: Any, _: type) -> list[str]:
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
        raise _expected("an array of strings", value)

    for kind, hook in (
        (int, integer),
        (float, number),
        (str, string),
        (bool, boolean),
        (list[str], strings),
    ):
        # A predicate: functools' dispatch takes no list[str].
        conv.register_structure_hook_func(_is(kind), hook)

    def host(value: Any, _: type) -> str | list[str] | None:
        if isinstance(value, str) or (
            isinstance(value, list) and all(isinstance(v, str) for v in value)
        ):
            return value
        raise _expected("a string or an array of strings", value)

    conv.register_structure_hook(str | list[str] | None, host)
    conv.register_structure_hook(list[str] | str | None, host)

    def int_or_text(value: Any, _: type) -> int | str | None:
        if isinstance(value, int | str) and not isinstance(value, bool):
            return value
        raise _expected('a number of MiB or "off"', value)

    conv.register_structure_hook(int | str | None, int_or_text)

    def seconds_or_off(value: Any, _: type) -> float | str | None:
        if isinstance(value, int | float | str) and not isinstance(value, bool):
            return value
        raise _expected('a number of seconds or "off"', value)

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
        parsed: object = _converter().structure(raw, _FILE)
    except cattrs.BaseValidationError as exc:
        # cattrs says "MESSAGE @ config.models.max": the key first, as a person reads it.
        problems = []
        for line in cattrs.transform_error(exc, path="config", format_exception=_format):
            message, _, where = line.rpartition(" @ ")
            where = where.removeprefix("config").removeprefix(".")
            problems.append(f"{where}: {message}" if where else message)
        raise ConfigError(f"{path}: {'; '.join(problems)}") from None
    return _given(parsed)


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
    for section in _SECTIONS:
        for setting in SETTINGS:
            toml = setting.toml
            value = cfg.get(setting)
            if toml is None or toml.section != section or value is None:
                continue
            found = (own_table if setting.own else table).by_spelling(setting.flag)
            assert found is not None, setting.flag
            if toml.relative == "path" and not Path(str(value)).is_absolute():
                value = str((base / str(value)).resolve())
            if toml.relative == "nodes" and isinstance(value, str) and "://" not in value:
                value = str((base / value).resolve())  # a node-list file, by the config's
            (own_opts if setting.own else engine_opts)[found[0]] = _text(value)
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
