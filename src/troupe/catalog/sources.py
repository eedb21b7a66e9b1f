"""The three model sources as presets: HF cache, ``--models-dir``, INI file.

``load_from_cache`` gives ``{hf-repo: "org/repo:TAG"}`` per cached model,
``load_from_models_dir`` gives ``{model, mmproj?, spec-draft-model?}`` per local
model, ``load_from_ini`` gives the file's sections. Each is then cascaded over the
INI's ``[*]`` section (``cascade``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import attrs

from troupe.catalog import hfcache
from troupe.catalog.inipresets import GLOBAL_SECTION, IniPresets, load_ini_presets
from troupe.catalog.modelsdir import scan_models_dir
from troupe.catalog.preset import Preset
from troupe.catalog.presetkeys import PresetKeys
from troupe.settings.options import EngineOption, OptionTable

__all__ = ["Sources", "cascade", "option_for_env", "read_sources"]

# What upstream's set_option needs from the option table, should a table lack one.
_FALLBACKS = {
    o.env: o
    for o in (
        EngineOption(
            ("-hf", "-hfr", "--hf-repo"), hints=("<user>/<model>[:quant]",), env="LLAMA_ARG_HF_REPO"
        ),
        EngineOption(("-m", "--model"), hints=("FNAME",), env="LLAMA_ARG_MODEL"),
        EngineOption(("-mm", "--mmproj"), hints=("FILE",), env="LLAMA_ARG_MMPROJ"),
        EngineOption(
            ("-md", "--spec-draft-model", "--model-draft"),
            hints=("FNAME",),
            env="LLAMA_ARG_SPEC_DRAFT_MODEL",
        ),
    )
}


def option_for_env(table: OptionTable, env: str) -> EngineOption:
    """The table's option with env name ``env`` (a built-in spelling if it has none)."""
    found = table.by_env(env)
    if found is not None:
        return found[0]
    return _FALLBACKS[env]


@attrs.frozen
class Sources:
    """Each source's presets, already cascaded over ``[*]``."""

    cache_root: Path  # the hub directory, absolute
    cached: dict[str, Preset]
    local: dict[str, Preset]
    ini: dict[str, Preset]
    global_: Preset


def cascade(base: Preset, presets: dict[str, Preset]) -> dict[str, Preset]:
    """Each preset applied over ``base`` (CSS-like), named after the preset."""
    return {name: base.renamed(name).merged(p) for name, p in presets.items()}


def _cache_presets(cache_root: Path, table: OptionTable) -> dict[str, Preset]:
    opt = option_for_env(table, "LLAMA_ARG_HF_REPO")
    return {name: Preset.build(name, [(opt, name)]) for name in hfcache.cached_models(cache_root)}


def _local_presets(shown: str, real: Path, table: OptionTable) -> dict[str, Preset]:
    model = option_for_env(table, "LLAMA_ARG_MODEL")
    mmproj = option_for_env(table, "LLAMA_ARG_MMPROJ")
    draft = option_for_env(table, "LLAMA_ARG_SPEC_DRAFT_MODEL")
    out: dict[str, Preset] = {}
    for name, m in scan_models_dir(shown, real).items():
        opts = [(model, m.path)]
        if m.mmproj:
            opts.append((mmproj, m.mmproj))
        if m.draft:
            opts.append((draft, m.draft))
        out[name] = Preset.build(name, opts)
    return out


def _spelled(
    path: Path,
    env: str,
    base_args: Sequence[tuple[EngineOption, str]],
    environ: Mapping[str, str],
) -> str:
    """``path`` as the user wrote it (upstream joins file names onto that text, so
    ``./models`` gives ``./models/a.gguf``); settings keep only a normalised Path."""
    raw = [v for o, v in base_args if o.env == env] or [environ.get(env, "")]
    return raw[-1] if raw[-1] and Path(raw[-1]) == path else os.fspath(path)


def read_sources(
    *,
    table: OptionTable,
    keys: PresetKeys,
    environ: Mapping[str, str],
    cwd: Path,
    models_dir: Path | None,
    models_preset: Path | None,
    base_args: Sequence[tuple[EngineOption, str]] = (),
) -> Sources:
    """Scan every source, in upstream's order (cache, models dir, INI), and cascade."""
    cache_root = cwd / hfcache.cache_dir(environ)
    cached = _cache_presets(cache_root, table)
    local: dict[str, Preset] = {}
    if models_dir is not None:
        shown = _spelled(models_dir, "LLAMA_ARG_MODELS_DIR", base_args, environ)
        local = _local_presets(shown, cwd / models_dir, table)
    ini = IniPresets(Preset(GLOBAL_SECTION), {})
    if models_preset is not None:
        shown = _spelled(models_preset, "LLAMA_ARG_MODELS_PRESET", base_args, environ)
        ini = load_ini_presets(cwd / models_preset, table, keys, shown=shown)
    g = ini.global_
    return Sources(cache_root, cascade(g, cached), cascade(g, local), cascade(g, ini.presets), g)
