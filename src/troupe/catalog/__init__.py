"""The model catalog: which models the router can start, and with what arguments.

Pure and synchronous (no Trio, no HTTP). It reproduces llama.cpp's router-mode
model list (its model sources and presets): the HF cache, ``--models-dir`` and the INI
preset file, merged with the router's own command line; aliases, tags, hidden
cache entries, child argument rendering and the ``status.preset`` text.
"""

from troupe.catalog.build import (
    base_preset,
    build_catalog,
    check_startup,
    merge_sources,
    restart_on_reload,
)
from troupe.catalog.entry import (
    DEFAULT_STOP_TIMEOUT,
    Architecture,
    ArchitectureProbe,
    Catalog,
    ModelEntry,
    Source,
)
from troupe.catalog.ini import PresetParseError, parse_ini, render_ini
from troupe.catalog.preset import Preset
from troupe.catalog.presetkeys import DEFAULT_PRESET_KEYS, PresetKeys, PresetOnlyKey
from troupe.catalog.render import child_args, needs_restart, status_preset

__all__ = [
    "DEFAULT_PRESET_KEYS",
    "DEFAULT_STOP_TIMEOUT",
    "Architecture",
    "ArchitectureProbe",
    "Catalog",
    "ModelEntry",
    "Preset",
    "PresetKeys",
    "PresetOnlyKey",
    "PresetParseError",
    "Source",
    "base_preset",
    "build_catalog",
    "check_startup",
    "child_args",
    "merge_sources",
    "needs_restart",
    "parse_ini",
    "render_ini",
    "restart_on_reload",
    "status_preset",
]
