"""INI sections to presets: key forms, negation, preset-only keys, section names."""

from __future__ import annotations

import pytest

from troupe.catalog.ini import parse_ini
from troupe.catalog.inipresets import canonical_section, lookup_key, presets_from_sections
from troupe.catalog.preset import Preset
from troupe.catalog.presetkeys import DEFAULT_PRESET_KEYS, PresetKeys, PresetOnlyKey
from troupe.errors import ConfigError
from troupe.settings.options import OptionTable


def load(text: str, table: OptionTable) -> tuple[Preset, dict[str, Preset]]:
    got = presets_from_sections(parse_ini(text), table, DEFAULT_PRESET_KEYS)
    return got.global_, got.presets


def as_dict(p: Preset) -> dict[str, str]:
    return {o.key: v for o, v in p.options} | dict(p.extras)


@pytest.mark.parametrize("key", ["ctx-size", "c", "LLAMA_ARG_CTX_SIZE"])
def test_long_short_and_env_keys_name_the_same_option(key: str, table: OptionTable) -> None:
    _, presets = load(f"[m]\n{key} = 2048\n", table)
    assert as_dict(presets["m"]) == {"ctx-size": "2048"}


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("no-jinja = true", {"jinja": "false"}),
        ("no-jinja = 1", {"jinja": "false"}),
        ("no-jinja = false", {"jinja": "true"}),
        ("no-jinja = garbage", {"jinja": "true"}),  # not truthy, so inverted to true
        ("jinja = off", {"jinja": "off"}),  # a positive key keeps its text
        ("nkvo = on", {"kv-offload": "false"}),  # short negated spelling
        ("no-kv-offload = TRUE", {"kv-offload": "true"}),  # truthiness is case-sensitive
        ("no-mmproj = true", {"mmproj-auto": "false"}),
        # an LLAMA_ARG_NO_* env-name key is *not* inverted upstream (preset.cpp parse_bool_arg)
        ("LLAMA_ARG_NO_CONT_BATCHING = 1", {"cont-batching": "1"}),
        ("LLAMA_ARG_CONT_BATCHING = 0", {"cont-batching": "0"}),
    ],
)
def test_negated_keys(line: str, expected: dict[str, str], table: OptionTable) -> None:
    _, presets = load(f"[m]\n{line}\n", table)
    assert as_dict(presets["m"]) == expected


def test_two_keys_for_one_option_last_in_byte_order_wins(table: OptionTable) -> None:
    # keys are visited in std::map order: "c" < "ctx-size"
    _, presets = load("[m]\nctx-size = 1\nc = 2\n", table)
    assert as_dict(presets["m"]) == {"ctx-size": "1"}


def test_preset_only_keys_and_their_pseudo_env_names(table: OptionTable) -> None:
    text = (
        "[m]\nload-on-startup = true\n__PRESET_STOP_TIMEOUT = 3\n"
        "dedup-cache-models = 1\npin = yes\nttl = 60\n"
    )
    _, presets = load(text, table)
    assert presets["m"].options == ()
    assert presets["m"].extras == (
        ("dedup-cache-models", "1"),
        ("load-on-startup", "true"),
        ("pin", "yes"),
        ("stop-timeout", "3"),
        ("ttl", "60"),
    )


def test_unknown_key_error_text(table: OptionTable) -> None:
    with pytest.raises(ConfigError) as info:
        load("[org/repo:q8_0]\nctx-size = 1\nnot-an-option = 1\n", table)
    assert str(info.value) == "option 'not-an-option' not recognized in preset 'org/repo:Q8_0'"


def test_unknown_key_in_global_and_default_sections(table: OptionTable) -> None:
    with pytest.raises(ConfigError, match=r"^option 'nope' not recognized in preset '\*'$"):
        load("[*]\nnope = 1\n", table)
    with pytest.raises(ConfigError, match=r"^option 'nope' not recognized in preset 'default'$"):
        load("nope = 1\n[a]\n", table)


def test_first_error_in_byte_order(table: OptionTable) -> None:
    with pytest.raises(ConfigError, match="option 'bad1' not recognized in preset 'A'"):
        load("[b]\nbad2 = 1\n[A]\nzz = 1\nbad1 = 2\n", table)


def test_dashed_keys_are_not_keys(table: OptionTable) -> None:
    assert lookup_key("--ctx-size", table, DEFAULT_PRESET_KEYS) is None
    assert lookup_key("ctx_size", table, DEFAULT_PRESET_KEYS) is None


def test_version_is_skipped_and_empty_default_dropped(table: OptionTable) -> None:
    glob, presets = load("version = 1\n[a]\nversion = 2\n", table)
    assert presets == {"a": Preset("a")}
    assert glob == Preset("*")


def test_keys_before_sections_make_a_default_model(table: OptionTable) -> None:
    _, presets = load("version = 1\nctx-size = 8\n[a]\n", table)
    assert sorted(presets) == ["a", "default"]
    assert as_dict(presets["default"]) == {"ctx-size": "8"}


def test_explicit_default_section_is_a_model(table: OptionTable) -> None:
    _, presets = load("[default]\nctx-size = 8\n", table)
    assert list(presets) == ["default"]


def test_global_section(table: OptionTable) -> None:
    glob, presets = load("[*]\nctx-size = 8\n[a]\n", table)
    assert as_dict(glob) == {"ctx-size": "8"}
    assert glob.name == "*"
    assert list(presets) == ["a"]


@pytest.mark.parametrize(
    ("raw", "name"),
    [
        ("org/repo:q4_k_m", "org/repo:Q4_K_M"),
        ("org/repo:UD-Q4_K_XL", "org/repo:Q4_K_XL"),
        ("org/repo:model.f16", "org/repo:F16"),
        ("a:b:c", "a:b:C"),
        ("org/repo", "org/repo"),
        ("org/repo:", "org/repo:"),
        ("x:q 4", "x:Q 4"),
        ("x:é", "x:é"),  # upper-casing is ASCII only, like toupper in the C locale
        ("*", "*"),
        ("default", "default"),
    ],
)
def test_canonical_section(raw: str, name: str) -> None:
    assert canonical_section(raw) == name


def test_sections_with_one_canonical_name_later_replaces(table: OptionTable) -> None:
    # raw names in byte order: "a:Q4" < "a:q4"; the later one replaces, no merge
    _, presets = load("[a:q4]\nctx-size = 2\n[a:Q4]\nn-predict = 1\n", table)
    assert list(presets) == ["a:Q4"]
    assert as_dict(presets["a:Q4"]) == {"ctx-size": "2"}


def test_registry_accepts_new_keys(table: OptionTable) -> None:
    extra = PresetOnlyKey("warm-up-prompt", "__TROUPE_WARM", "TEXT", "test", upstream=False)
    keys = DEFAULT_PRESET_KEYS.with_key(extra)
    got = presets_from_sections(parse_ini("[m]\nwarm-up-prompt = hi\n"), table, keys)
    assert got.presets["m"].extras == (("warm-up-prompt", "hi"),)
    assert keys.lookup("__TROUPE_WARM") is extra
    with pytest.raises(ValueError, match="bad preset-only key"):
        PresetKeys((PresetOnlyKey("-x", "__X", "", ""),))
