"""The settings table (troupe.settings.table) is the one declaration of every router
setting: each one reaches `troupe serve --help`, the config file, the environment and
the reference's table (docs/configuration.md), and the router flags agree with
llama-server's own --help."""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path

import attrs
import pytest

from troupe.cli_help import SERVE_HELP
from troupe.errors import UsageError
from troupe.settings import table as settings_table
from troupe.settings.config_file import config_options, load_config
from troupe.settings.options import EngineOption, OptionTable, parse_help
from troupe.settings.router import RouterSettings, build_settings, with_router_options
from troupe.settings.table import CONFIG, SETTINGS, Raw, Setting, reference_table

ROOT = Path(__file__).resolve().parents[2]
ENGINE_HELP = (ROOT / "tests" / "data" / "llama-server-help.txt").read_text()
CONFIGURATION = ROOT / "docs" / "configuration.md"

TomlValue = str | int | float | bool | list[str]


@pytest.fixture(scope="module")
def table() -> OptionTable:
    return with_router_options(parse_help(ENGINE_HELP))


def _ids(settings: tuple[Setting[object], ...]) -> list[str]:
    return [s.flag for s in settings]


def _mentions(text: str, spelling: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(spelling)}(?![\w-])", text) is not None


def test_the_table_lists_every_setting_once() -> None:
    declared = [v for v in vars(settings_table).values() if isinstance(v, Setting)]
    assert set(declared) == set(SETTINGS)
    assert len(SETTINGS) == len(set(SETTINGS))
    spellings = [x for s in SETTINGS for x in (*s.spellings, *s.negatives)]
    assert len(spellings) == len(set(spellings))
    envs = [s.env for s in SETTINGS if s.env]
    assert len(envs) == len(set(envs))
    keys = [(s.toml.section, s.toml.key) for s in SETTINGS if s.toml]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize("setting", SETTINGS, ids=_ids(SETTINGS))
def test_every_setting_is_in_serve_help(setting: Setting[object]) -> None:
    if setting.help is None:
        # A router flag troupe leaves to the engine: its --help lists it, and troupe's
        # says so ("every other llama-server flag ... See `llama-server --help`").
        assert not setting.own
        assert _mentions(ENGINE_HELP, setting.flag)
        assert "every other llama-server flag" in SERVE_HELP
        return
    for spelling in (*setting.spellings, *setting.negatives):
        assert _mentions(SERVE_HELP, spelling), spelling
    if setting.env and setting.help.env:
        assert f"(env: {setting.env})" in SERVE_HELP


def test_help_states_the_declared_defaults() -> None:
    lead: Setting[object] | None = None
    for s in SETTINGS:
        if s.help is None:
            continue
        if not s.help.joined:
            lead = s
        assert lead is not None
        assert lead.help is not None
        if lead.help.text and s.default:
            assert s.default in " ".join(lead.help.text), s.flag


def test_router_flags_are_the_engines_and_troupes_own_flags_are_not() -> None:
    engine = parse_help(ENGINE_HELP)
    for s in SETTINGS:
        found = engine.by_spelling(s.flag)
        if s.own:
            assert found is None, f"{s.flag} would hide llama-server's own flag"
        else:
            assert found is not None, s.flag
            assert found[0] == s.option, s.flag


def _toml_types(setting: Setting[object]) -> tuple[object, ...]:
    assert setting.toml is not None
    kind = setting.toml.type
    return typing.get_args(kind) if isinstance(kind, types.UnionType) else (kind,)


def _as_text(value: TomlValue) -> str:
    """How the config file hands a value on (a command-line word)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, list):
        return ",".join(value)
    return str(value)


def _toml(value: TomlValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(f'"{v}"' for v in value) + "]"
    if isinstance(value, str):
        return f"'{value}'"
    return str(value)


def _parsed(setting: Setting[object], text: str) -> object:
    try:
        return setting.parse(Raw(setting.flag, setting.flag, text))
    except UsageError:
        return UsageError


def _sample(setting: Setting[object], tmp_path: Path) -> TomlValue:
    """A value of the setting's TOML type that parses, to something not the default."""
    # One file for every file setting: a JSON object (--ui-config-file) that is also a
    # line of keys (--api-key-file) and a "name:key" line (--named-api-keys).
    file = tmp_path / "file.txt"
    file.write_text('{"a": "b:c"}\n')
    strings: list[TomlValue] = [str(file), str(tmp_path), "off", "on", '{"a": 1}', "json"]
    by_type: Mapping[object, list[TomlValue]] = {
        str: strings,
        int: [3],
        float: [2.5],
        bool: [False, True],
        list[str]: [["a", "b"]],
    }
    kinds = _toml_types(setting) if setting.toml else (str,)
    default = _parsed(setting, setting.default)
    for kind in kinds:
        for value in by_type[kind]:
            parsed = _parsed(setting, _as_text(value))
            if parsed is not UsageError and parsed != default:
                return value
    raise AssertionError(f"no sample value for {setting.flag}")


def _settings(
    table: OptionTable,
    cli: Mapping[EngineOption, str] | None = None,
    own: Mapping[EngineOption, str] | None = None,
    env: Mapping[str, str] | None = None,
    config: Path | None = None,
) -> RouterSettings:
    opts: dict[EngineOption, str] = {}
    file_own: dict[EngineOption, str] = {}
    if config is not None:
        opts, file_own = config_options(load_config(config), table, config.parent)
    return build_settings(table, cli or {}, own or {}, env or {}, opts, file_own)


READ = tuple(s for s in SETTINGS if s is not CONFIG)


def test_only_config_itself_is_read_elsewhere() -> None:
    # --config names the file (troupe.prepare reads it): it has no key in the file.
    assert CONFIG.own
    assert CONFIG.toml is None


@pytest.mark.parametrize("setting", READ, ids=_ids(READ))
def test_every_setting_from_the_file_and_the_environment_as_from_its_flag(
    setting: Setting[object], table: OptionTable, tmp_path: Path
) -> None:
    value = _sample(setting, tmp_path)
    text = _as_text(value)
    if setting.own:
        option = setting.option
        from_flag = _settings(table, own={option: text})
    else:
        found = table.by_spelling(setting.flag)
        assert found is not None
        from_flag = _settings(table, cli={found[0]: text})
    assert from_flag != _settings(table)  # the sample is not the default

    path = tmp_path / "troupe.toml"
    if setting.toml is not None:
        path.write_text(f"[{setting.toml.section}]\n{setting.toml.key} = {_toml(value)}\n")
    else:  # a router flag without a key of its own: [child], as llama-server's options
        assert not setting.own
        path.write_text(f"[child]\n{setting.flag.lstrip('-')} = {_toml(value)}\n")
    assert _settings(table, config=path) == from_flag

    if setting.env:  # children inherit the environment: not among the forwarded args
        from_env = _settings(table, env={setting.env: text})
        assert from_env == attrs.evolve(from_flag, base_args=())


def test_the_configuration_page_lists_every_setting() -> None:
    text = CONFIGURATION.read_text()
    begin, end = "<!-- settings-table: begin -->\n", "<!-- settings-table: end -->"
    assert begin in text
    assert end in text
    shown = text.split(begin, 1)[1].split(end, 1)[0]
    assert shown == reference_table(), (
        "docs/configuration.md's settings table is not the table's: replace it with the output of\n"
        "  .venv/bin/python -c 'from troupe.settings.table import reference_table as t; "
        'print(t(), end="")\''
    )
    for s in SETTINGS:
        assert f"`{s.flag}`" in shown
        if s.env:
            assert f"`{s.env}`" in shown
