"""Presets, merging and rendering, on the real option table."""

from __future__ import annotations

from pathlib import Path

import pytest

from troupe.catalog import Preset, Source, merge_sources, needs_restart
from troupe.catalog.render import child_args, child_preset, preset_args
from troupe.catalog.sources import Sources
from troupe.settings.options import EngineOption, OptionTable


def opt(table: OptionTable, spelling: str) -> EngineOption:
    found = table.by_spelling(spelling)
    assert found is not None
    return found[0]


def test_preset_orders_by_first_spelling_and_later_wins(table: OptionTable) -> None:
    p = Preset.build(
        "m",
        [
            (opt(table, "--model"), "a"),
            (opt(table, "--temp"), "1"),
            (opt(table, "--ctx-size"), "2"),
            (opt(table, "-c"), "3"),
        ],
        {"stop-timeout": "1", "load-on-startup": "1"},
    )
    assert [(o.sort_name, v) for o, v in p.options] == [("--temp", "1"), ("-c", "3"), ("-m", "a")]
    assert [k for k, _ in p.extras] == ["load-on-startup", "stop-timeout"]
    assert p.get("LLAMA_ARG_CTX_SIZE") == "3"
    assert p.get_spelling("--temperature") == "1"
    assert p.get("LLAMA_ARG_NOPE") is None


def test_merge_overwrites_and_keeps_name(table: OptionTable) -> None:
    base = Preset.build("base", [(opt(table, "-c"), "1"), (opt(table, "--seed"), "2")])
    over = Preset.build("over", [(opt(table, "-c"), "9")], {"pin": "1"})
    merged = base.merged(over)
    assert merged.name == "base"
    assert [v for _, v in merged.options] == ["9", "2"]
    assert merged.extras == (("pin", "1"),)


def test_preset_args_rules(table: OptionTable) -> None:
    p = Preset.build(
        "m",
        [
            (opt(table, "--jinja"), "0"),  # falsey with a negative: last negative spelling
            (opt(table, "--mmproj-auto"), "off"),
            (opt(table, "--repack"), "enabled"),
            (opt(table, "--swa-full"), "false"),  # falsey, no negative: dropped
            (opt(table, "--embedding"), "1"),
            (opt(table, "--api-prefix"), ""),  # an empty value is still a value
            (opt(table, "-fa"), "auto"),
        ],
        {"stop-timeout": "3"},  # preset-only: never rendered
    )
    assert preset_args(p) == [
        "--api-prefix",
        "",
        "--embeddings",
        "--no-jinja",
        "--no-mmproj-auto",
        "--repack",
        "--flash-attn",
        "auto",
    ]


def test_child_preset_strips_reserved_and_forces_four(table: OptionTable) -> None:
    p = Preset.build(
        "m",
        [
            (opt(table, "--api-key"), "k"),
            (opt(table, "--models-dir"), "d"),
            (opt(table, "--host"), "0.0.0.0"),
            (opt(table, "-a"), "x,y"),
            (opt(table, "--log-colors"), "auto"),
        ],
    )
    got = child_preset(p, "name", 123, log_colors=False)
    assert [(o.key, v) for o, v in got.options] == [
        ("host", "127.0.0.1"),
        ("log-colors", "off"),
        ("port", "123"),
        ("alias", "name"),
    ]
    assert child_args(p, "name", 1, bin_path="/b")[0] == "/b"


@pytest.mark.parametrize(
    ("running", "fresh", "restart"),
    [
        ({}, {}, False),
        ({"--port": "5", "--host": "x", "-a": "n", "--log-colors": "on"}, {}, False),
        ({}, {"-a": "new,alias", "--port": "7"}, False),
        ({"-c": "1"}, {"-c": "2"}, True),
        ({"-c": "1"}, {}, True),
        ({"--api-key": "k"}, {}, False),  # the running side is compared after update_args
        ({}, {"--api-key": "k"}, True),  # ...the fresh side is not: upstream restarts it
        ({"-m": "a"}, {"--model": "a"}, False),
    ],
)
def test_needs_restart(
    running: dict[str, str], fresh: dict[str, str], restart: bool, table: OptionTable
) -> None:
    def make(d: dict[str, str]) -> Preset:
        return Preset.build("m", [(opt(table, k), v) for k, v in d.items()])

    assert needs_restart(make(running), make(fresh)) is restart


def test_needs_restart_preset_only_keys() -> None:
    assert needs_restart(Preset("m", extras=(("stop-timeout", "1"),)), Preset("m"))
    assert needs_restart(Preset("m", extras=(("load-on-startup", "1"),)), Preset("m"))
    # troupe's own keys act on the router only
    assert not needs_restart(Preset("m", extras=(("pin", "1"), ("ttl", "5"))), Preset("m"))


def test_models_dir_replaces_cache_entry_and_ini_merges(table: OptionTable) -> None:
    hf, model, ctx = opt(table, "-hf"), opt(table, "-m"), opt(table, "-c")
    src = Sources(
        cache_root=Path("/c"),
        cached={"x": Preset.build("x", [(hf, "o/r:Q4_0")]), "y": Preset.build("y", [(hf, "y")])},
        local={"x": Preset.build("x", [(model, "x.gguf")])},
        ini={"y": Preset.build("y", [(ctx, "5")]), "z": Preset.build("z", [(ctx, "6")])},
        global_=Preset("*"),
    )
    final, source = merge_sources(src, Preset.build("default", [(ctx, "7")]))
    assert list(final) == ["x", "y", "z"]
    assert [(o.key, v) for o, v in final["x"].options] == [("ctx-size", "7"), ("model", "x.gguf")]
    assert [(o.key, v) for o, v in final["y"].options] == [("ctx-size", "7"), ("hf-repo", "y")]
    assert source == {"x": Source.MODELS_DIR, "y": Source.PRESET, "z": Source.PRESET}
