"""INI sections to presets (``common_preset_context::load_from_ini``).

A key is a llama-server option spelling without its dashes (long, short or
negated) or one of the option's env names, or a preset-only key (or its pseudo
env name). A negated *spelling* inverts a boolean's value ("no-mmap = true" is
mmap "false"); upstream does not invert an ``LLAMA_ARG_NO_*`` env-name key.
Sections are visited in byte-wise order of their raw names and keys likewise,
so the first error reported is upstream's.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from troupe.catalog.hfcache import canonical_tag
from troupe.catalog.ini import DEFAULT_SECTION, read_ini_file, sorted_sections
from troupe.catalog.preset import Preset
from troupe.catalog.presetkeys import PresetKeys, PresetOnlyKey
from troupe.catalog.values import is_truthy
from troupe.errors import ConfigError
from troupe.settings.options import EngineOption, OptionTable

__all__ = ["GLOBAL_SECTION", "IniPresets", "canonical_section", "load_ini_presets", "lookup_key"]

GLOBAL_SECTION = "*"


@attrs.frozen
class IniPresets:
    """The ``[*]`` section and the model sections of one preset file."""

    global_: Preset
    presets: dict[str, Preset]


def canonical_section(name: str) -> str:
    """``[org/repo:q4_k_m]`` -> ``org/repo:Q4_K_M`` (the part after the last colon)."""
    if name in (GLOBAL_SECTION, DEFAULT_SECTION):
        return name
    head, colon, tag = name.rpartition(":")
    if not colon:
        return name
    return f"{head}:{canonical_tag(tag)}"


def lookup_key(
    key: str, table: OptionTable, keys: PresetKeys
) -> tuple[EngineOption, bool] | PresetOnlyKey | None:
    """What a preset key names: ``(option, spelled negated)``, a preset-only key, or None."""
    extra = keys.lookup(key)
    if extra is not None:
        return extra  # upstream registers them last, so they win any clash
    found = table.by_env(key)
    if found is not None:
        return found[0], False  # an LLAMA_ARG_NO_* key is not inverted upstream
    for dashes in ("--", "-"):
        found = table.by_spelling(dashes + key)
        if found is not None:
            return found
    return None


def _section_preset(
    name: str, items: list[tuple[str, str]], table: OptionTable, keys: PresetKeys
) -> Preset:
    options: list[tuple[EngineOption, str]] = []
    extras: list[tuple[str, str]] = []
    for key, value in items:
        if key == "version":
            continue  # reserved for future use
        found = lookup_key(key, table, keys)
        if found is None:
            raise ConfigError(f"option '{key}' not recognized in preset '{name}'")
        if isinstance(found, PresetOnlyKey):
            extras.append((found.key, value))
            continue
        opt, negated = found
        if opt.negatives and negated:
            options.append((opt, "false" if is_truthy(value) else "true"))
        else:
            options.append((opt, value))
    return Preset.build(name, options, extras)


def presets_from_sections(
    parsed: dict[str, dict[str, str]], table: OptionTable, keys: PresetKeys
) -> IniPresets:
    """Build presets from parsed sections (see `troupe.catalog.ini.parse_ini`)."""
    global_ = Preset(GLOBAL_SECTION)
    out: dict[str, Preset] = {}
    for raw_name, items in sorted_sections(parsed):
        name = canonical_section(raw_name or DEFAULT_SECTION)
        preset = _section_preset(name, items, table, keys)
        if name == DEFAULT_SECTION and preset.is_empty():
            continue
        if name == GLOBAL_SECTION:
            global_ = preset
        else:
            out[name] = preset  # a later raw name with the same canonical name replaces
    return IniPresets(global_, out)


def load_ini_presets(
    path: Path, table: OptionTable, keys: PresetKeys, shown: str | None = None
) -> IniPresets:
    """Read ``path`` and build its presets; errors are `ConfigError` (one line)."""
    return presets_from_sections(read_ini_file(path, shown), table, keys)
