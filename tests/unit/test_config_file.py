"""The router config file: structured, path-named errors, and command line > env > file."""

from __future__ import annotations

from pathlib import Path

import pytest

from troupe.errors import ConfigError
from troupe.settings.argv import parse_engine_args
from troupe.settings.config_file import config_options, load_config
from troupe.settings.options import OptionTable, parse_help
from troupe.settings.router import build_settings, with_router_options

HELP = Path(__file__).parent.parent / "data" / "llama-server-help.txt"


@pytest.fixture(scope="module")
def table() -> OptionTable:
    return with_router_options(parse_help(HELP.read_text()))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "troupe.toml"
    path.write_text(text)
    return path


def test_every_section_maps_to_settings(table: OptionTable, tmp_path: Path) -> None:
    (tmp_path / "models").mkdir()
    cfg_path = write(
        tmp_path,
        """
[server]
host = ["127.0.0.1", "::1"]
port = 9000
api_keys = ["a", "b"]
cors_credentials = false
[models]
dir = "models"
max = 2
autoload = false
[troupe]
log_level = "debug"
max_body_mib = 8
[child]
ctx-size = 2048
no-jinja = true
""",
    )
    cfg = load_config(cfg_path)
    opts, own = config_options(cfg, table, cfg_path.parent)
    s = build_settings(table, {}, {}, {}, opts, own)
    assert s.hosts == ("127.0.0.1", "::1")
    assert s.port == 9000
    assert s.api_keys == ("a", "b")
    assert s.cors_credentials is False
    assert s.models_dir == tmp_path / "models"  # relative to the file
    assert s.models_max == 2
    assert s.models_autoload is False
    assert s.log_level == "debug"
    assert s.max_body_bytes == 8 << 20
    forwarded = {o.long_name: v for o, v in s.base_args}
    assert forwarded["--ctx-size"] == "2048"
    assert forwarded["--jinja"] == "0"  # no-jinja = true: jinja off


def test_command_line_beats_environment_beats_file(table: OptionTable, tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "[models]\nmax = 2\n[server]\nport = 9000\ntimeout = 5\n"))
    opts, own = config_options(cfg, table, tmp_path)
    cli = parse_engine_args(["--models-max", "7"], table)
    env = {"LLAMA_ARG_PORT": "9100"}
    s = build_settings(table, cli, {}, env, opts, own)
    assert s.models_max == 7
    assert s.port == 9100
    assert s.timeout == 5


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("[server]\nport = 'eighty'\n", 'server.port: expected an integer, got "eighty"'),
        ('[models]\nmax = "x"\n', 'troupe.toml: models.max: expected an integer, got "x"'),
        ("[models]\nautoload = 1\n", "models.autoload: expected true or false, got 1"),
        ("[server]\nprot = 1\n", "troupe.toml: server: unknown key prot"),
        ("[modles]\n", "troupe.toml: unknown key modles"),
        ("[child]\nno-such-option = 1\n", "[child] option 'no-such-option'"),
        ("[server\n", "not valid TOML"),
        ("[server]\nhost = 3\n", "server.host: expected a string or an array of strings, got 3"),
    ],
)
def test_mistakes_name_the_key(
    table: OptionTable, tmp_path: Path, text: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        config_options(load_config(write(tmp_path, text)), table, tmp_path)
    assert fragment in str(caught.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "nope.toml")


def test_cluster_nodes_from_the_file_or_the_command_line(
    table: OptionTable, tmp_path: Path
) -> None:
    listed = write(tmp_path, '[troupe]\ncluster_nodes = ["http://a:8080", "b:8080"]\n')
    opts, own = config_options(load_config(listed), table, tmp_path)
    assert build_settings(table, {}, {}, {}, opts, own).cluster_nodes == "http://a:8080,b:8080"
    (tmp_path / "nodes.txt").write_text("http://a:8080\n")
    in_file = write(tmp_path, '[troupe]\ncluster_nodes = "nodes.txt"\n')
    opts, own = config_options(load_config(in_file), table, tmp_path)
    s = build_settings(table, {}, {}, {}, opts, own)
    assert s.cluster_nodes == str(tmp_path / "nodes.txt")  # by the config file's directory
    assert build_settings(table, {}, {}, {}).cluster_nodes == ""  # one node: no cluster
