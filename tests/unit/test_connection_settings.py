"""The connection flags (``--max-connections-per-client``,
``--body-min-rate``, ``--body-rate-grace``): defaults, flag, environment, config file,
bad values, and what the HTTP server is told."""

from __future__ import annotations

from pathlib import Path

import pytest

from troupe.errors import UsageError
from troupe.http.serve import server_config
from troupe.prepare import split_troupe_flags
from troupe.settings.config_file import config_options, load_config
from troupe.settings.options import OptionTable, parse_help
from troupe.settings.router import build_settings, with_router_options

HELP = Path(__file__).parent.parent / "data" / "llama-server-help.txt"


@pytest.fixture(scope="module")
def table() -> OptionTable:
    return with_router_options(parse_help(HELP.read_text()))


def test_defaults_reach_the_server(table: OptionTable) -> None:
    config = server_config(build_settings(table, {}, {}, {}))
    assert (config.max_per_client, config.body_min_rate, config.body_rate_grace) == (256, 500, 10)
    assert config.per_client_loopback is False  # a proxy on the same host is one address


def test_flag_env_and_file(table: OptionTable, tmp_path: Path) -> None:
    own, _ = split_troupe_flags(
        ["--max-connections-per-client", "0", "--body-min-rate", "1000", "--body-rate-grace", "2.5"]
    )
    settings = build_settings(table, {}, own, {})
    assert settings.max_connections_per_client == 0
    assert (settings.body_min_rate, settings.body_rate_grace) == (1000, 2.5)
    env = {"TROUPE_BODY_MIN_RATE": "0", "TROUPE_MAX_CONNECTIONS_PER_CLIENT": "8"}
    settings = build_settings(table, {}, {}, env)
    assert (settings.body_min_rate, settings.max_connections_per_client) == (0, 8)
    path = tmp_path / "troupe.toml"
    path.write_text("[troupe]\nbody_rate_grace = 30\nmax_connections_per_client = 64\n")
    opts, file_own = config_options(load_config(path), table, tmp_path)
    settings = build_settings(table, {}, {}, {}, opts, file_own)
    assert (settings.body_rate_grace, settings.max_connections_per_client) == (30, 64)


@pytest.mark.parametrize(
    "flags",
    [
        ["--body-min-rate", "-1"],
        ["--body-rate-grace", "0"],
        ["--body-rate-grace", "soon"],
        ["--max-connections-per-client", "-2"],
    ],
)
def test_bad_values_name_the_flag(table: OptionTable, flags: list[str]) -> None:
    own, _ = split_troupe_flags(flags)
    with pytest.raises(UsageError, match=flags[0]):
        build_settings(table, {}, own, {})
