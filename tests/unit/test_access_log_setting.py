"""``--access-log on|off``: the flag, its environment variable and the config file key."""

from __future__ import annotations

from pathlib import Path

import pytest

from troupe.errors import UsageError
from troupe.prepare import split_troupe_flags
from troupe.settings.config_file import config_options, load_config
from troupe.settings.options import OptionTable, parse_help
from troupe.settings.router import build_settings, with_router_options

HELP = Path(__file__).parent.parent / "data" / "llama-server-help.txt"


@pytest.fixture(scope="module")
def table() -> OptionTable:
    return with_router_options(parse_help(HELP.read_text()))


def test_default_flag_env_and_file(table: OptionTable, tmp_path: Path) -> None:
    assert build_settings(table, {}, {}, {}).access_log is False
    own, _ = split_troupe_flags(["--access-log", "on"])
    assert build_settings(table, {}, own, {}).access_log is True
    assert build_settings(table, {}, {}, {"TROUPE_ACCESS_LOG": "on"}).access_log is True
    path = tmp_path / "troupe.toml"
    path.write_text('[troupe]\naccess_log = "on"\n')
    opts, file_own = config_options(load_config(path), table, tmp_path)
    assert build_settings(table, {}, {}, {}, opts, file_own).access_log is True


def test_bad_value_names_the_flag(table: OptionTable) -> None:
    own, _ = split_troupe_flags(["--access-log", "yes please"])
    with pytest.raises(UsageError, match="--access-log"):
        build_settings(table, {}, own, {})
