"""Building the catalog: sources merged, router CLI on top, entries checked.

``server_models::load_models``: cache < models dir (replaces) < INI (merges), each
cascaded over ``[*]``; then the router's own command line (the base preset, with
reserved and model options removed) over every model; cache entries hidden by a
``dedup-cache-models`` preset; models added in byte-wise name order with their
aliases checked; stop timeouts applied; on the first load, the
``load-on-startup`` count checked against ``--models-max``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import attrs

from troupe.catalog import hfcache, render
from troupe.catalog.entry import (
    DEFAULT_STOP_TIMEOUT,
    Architecture,
    ArchitectureProbe,
    Catalog,
    ModelEntry,
    Source,
)
from troupe.catalog.preset import Preset
from troupe.catalog.presetkeys import (
    DEDUP_CACHE_MODELS,
    DEFAULT_PRESET_KEYS,
    KV_STORE,
    LOAD_ON_STARTUP,
    PIN,
    STOP_TIMEOUT,
    TERM_GRACE,
    TTL,
    PresetKeys,
)
from troupe.catalog.sources import Sources, read_sources
from troupe.catalog.values import byte_order, is_truthy, split_list, stoi
from troupe.errors import ConfigError
from troupe.settings.options import OptionTable
from troupe.settings.router import RouterSettings

__all__ = [
    "base_preset",
    "build_catalog",
    "check_startup",
    "merge_sources",
    "restart_on_reload",
]


def base_preset(settings: RouterSettings) -> Preset:
    """The router's command line as a preset, minus what children must not inherit."""
    p = Preset.build("default", settings.base_args)  # a later repeat wins
    return p.without_env(*render.RESERVED_ENVS, *render.RESERVED_MODEL_ENVS, "LLAMA_ARG_LOG_FILE")


def merge_sources(src: Sources, base: Preset) -> tuple[dict[str, Preset], dict[str, Source]]:
    """Final presets by name (byte-wise order) and the source of each."""
    final: dict[str, Preset] = {}
    source: dict[str, Source] = {}
    for name, p in src.cached.items():
        final[name], source[name] = p, Source.CACHE
    for name, p in src.local.items():
        final[name], source[name] = p, Source.MODELS_DIR  # replaces a cache entry
    for name, p in src.ini.items():
        final[name] = final[name].merged(p) if name in final else p
        source[name] = Source.PRESET
    ordered = sorted(final, key=byte_order)
    return {n: final[n].merged(base) for n in ordered}, source


def _hidden(src: Sources, source: dict[str, Source]) -> frozenset[str]:
    paths: set[Path] = set()
    for _, p in sorted(src.ini.items(), key=lambda kv: byte_order(kv[0])):
        if not is_truthy(p.extra(DEDUP_CACHE_MODELS.key) or ""):
            continue
        for repo_env, file_env in (
            ("LLAMA_ARG_HF_REPO", "LLAMA_ARG_HF_FILE"),
            ("LLAMA_ARG_SPEC_DRAFT_HF_REPO", "LLAMA_ARG_SPEC_DRAFT_MODEL"),
        ):
            repo = p.get(repo_env)
            if repo:
                path = hfcache.resolve_path(src.cache_root, repo, p.get(file_env) or "")
                if path is not None:
                    paths.add(path)
    if not paths:
        return frozenset()
    return frozenset(
        name
        for name in src.cached
        if source[name] is Source.CACHE and hfcache.resolve_path(src.cache_root, name) in paths
    )


class _AliasBook:
    """Aliases checked model by model in name order (``add_model``; lenient on reload)."""

    def __init__(self, names: list[str], strict: bool, warnings: list[str]) -> None:
        self.names = names
        self.strict = strict
        self.warnings = warnings
        self.accepted: dict[str, frozenset[str]] = {}

    def add(self, name: str, preset: Preset) -> frozenset[str]:
        wanted = sorted(split_list(preset.get("LLAMA_ARG_ALIAS") or ""), key=byte_order)
        keep = self._check_strict(name, wanted) if self.strict else self._lenient(name, wanted)
        self.accepted[name] = frozenset(keep)
        return self.accepted[name]

    def _check_strict(self, name: str, wanted: list[str]) -> list[str]:
        for other, theirs in self.accepted.items():
            if name in theirs:
                raise ConfigError(f"model name '{name}' conflicts with alias of model '{other}'")
        for alias in wanted:
            if alias in self.accepted:
                raise ConfigError(
                    f"alias '{alias}' for model '{name}' conflicts with existing model name"
                )
            for other, theirs in self.accepted.items():
                if alias in theirs:
                    raise ConfigError(
                        f"alias '{alias}' for model '{name}' conflicts with alias of model "
                        f"'{other}'"
                    )
        return wanted

    def _lenient(self, name: str, wanted: list[str]) -> list[str]:
        keep: list[str] = []
        for alias in wanted:
            clash = next(
                (
                    o
                    for o in self.names
                    if o != name and (o == alias or alias in self.accepted.get(o, ()))
                ),
                None,
            )
            if clash is None:
                keep.append(alias)
            else:
                self.warnings.append(
                    f"(reload) alias '{alias}' for model '{name}' conflicts with model "
                    f"'{clash}', skipping"
                )
        return keep


def _stop_timeout(preset: Preset, name: str, warnings: list[str]) -> int:
    raw = preset.extra(STOP_TIMEOUT.key)
    if raw is None:
        return DEFAULT_STOP_TIMEOUT
    try:
        return stoi(raw)
    except ValueError:
        warnings.append(
            f"invalid stop-timeout value '{raw}' for model '{name}', "
            f"using default {DEFAULT_STOP_TIMEOUT} seconds"
        )
        return DEFAULT_STOP_TIMEOUT


def _parsed(preset: Preset, name: str, keys: PresetKeys, key: str, default: object) -> object:
    raw = preset.extra(key)
    spec = keys.lookup(key)
    if raw is None or spec is None:
        return default
    try:
        return spec.parse(raw)
    except ValueError as exc:
        raise ConfigError(f"invalid value '{raw}' for '{key}' in preset '{name}': {exc}") from None


def _local_files(preset: Preset, cache_root: Path, cwd: Path) -> tuple[Path | None, Path | None]:
    """The model and projector files upstream's update_caps would read, offline."""
    no_mmproj = (auto := preset.get("LLAMA_ARG_MMPROJ_AUTO")) is not None and not is_truthy(auto)
    model = preset.get("LLAMA_ARG_MODEL")
    mmproj = preset.get("LLAMA_ARG_MMPROJ")
    model_path = cwd / model if model else None
    mmproj_path = cwd / mmproj if mmproj else None
    repo = preset.get("LLAMA_ARG_HF_REPO")
    if model_path is None and repo:
        try:
            repo_id, tag = hfcache.split_repo_tag(repo)
        except ConfigError:
            repo_id, tag = "", ""
        files = hfcache.cached_files(cache_root, repo_id) if repo_id else []
        hf_file = preset.get("LLAMA_ARG_HF_FILE") or ""
        best = (
            next((f for f in files if f.path == hf_file), None)
            if hf_file
            else hfcache.find_best_model(files, tag)
        )
        if best is not None:
            model_path = best.local_path
            if mmproj_path is None and (sib := hfcache.find_best_mmproj(files, best.path)):
                mmproj_path = sib.local_path
    return model_path, None if no_mmproj else mmproj_path


def restart_on_reload(
    running: ModelEntry, fresh: ModelEntry | None, keys: PresetKeys = DEFAULT_PRESET_KEYS
) -> bool:
    """Whether a reload must stop a *running* model: it left every source (``fresh`` is
    None) or its preset changed (host, port, alias and log-colors ignored)."""
    return fresh is None or render.needs_restart(running.preset, fresh.preset, keys)


def check_startup(catalog: Catalog, models_max: int) -> None:
    """Upstream's first-load check (also with ``--models-max 0``, "unlimited")."""
    count = len(catalog.startup_models())
    if count > models_max:
        raise ConfigError(
            f"number of models to load on startup ({count}) exceeds models_max ({models_max})"
        )


def build_catalog(
    settings: RouterSettings,
    table: OptionTable,
    environ: Mapping[str, str],
    cwd: Path,
    *,
    reload: bool = False,
    keys: PresetKeys = DEFAULT_PRESET_KEYS,
    probe: ArchitectureProbe | None = None,
) -> Catalog:
    """Scan every source and build the catalog.

    ``reload=False`` (the first load) makes a name or alias conflict fatal and
    checks ``load-on-startup`` against ``models_max``; ``reload=True`` skips a
    conflicting alias with a warning instead. Errors are `ConfigError` with
    upstream's message (the caller prefixes "failed to initialize router models: ").
    """
    cwd = cwd.absolute()
    src = read_sources(
        table=table,
        keys=keys,
        environ=environ,
        cwd=cwd,
        models_dir=settings.models_dir,
        models_preset=settings.models_preset,
        base_args=settings.base_args,
    )
    final, source = merge_sources(src, base_preset(settings))
    hidden = _hidden(src, source)
    warnings: list[str] = []
    book = _AliasBook(list(final), strict=not reload, warnings=warnings)
    forced = render.forced_options({o.env: o for o in table if o.env})
    entries: list[ModelEntry] = []
    for name, preset in final.items():
        aliases = book.add(name, preset)
        render.child_args(preset, name, 0, bin_path="", forced=forced)  # what add_model renders
        model_path, mmproj_path = _local_files(preset, src.cache_root, cwd)
        ttl = _parsed(preset, name, keys, TTL.key, None)
        entry = ModelEntry(
            name=name,
            source=source[name],
            preset=preset,
            aliases=aliases,
            tags=split_list(preset.get("LLAMA_ARG_TAGS") or ""),
            hidden=name in hidden,
            stop_timeout=_stop_timeout(preset, name, warnings),
            load_on_startup=is_truthy(preset.extra(LOAD_ON_STARTUP.key) or ""),
            pin=bool(_parsed(preset, name, keys, PIN.key, False)),
            ttl=ttl if isinstance(ttl, int) else None,
            term_grace=float(_parsed(preset, name, keys, TERM_GRACE.key, 5.0)),  # type: ignore[arg-type]
            kv_store=bool(_parsed(preset, name, keys, KV_STORE.key, True)),
            model_path=model_path,
            mmproj_path=mmproj_path,
        )
        if model_path is not None and not model_path.exists():
            # Upstream starts such a model and fails its first load; say so at start.
            where = f"preset section [{name}]" if source[name] == "preset" else f"model {name}"
            warnings.append(
                f"{where}: model file {model_path}: no such file "
                "(its requests fail until it exists)"
            )
        if probe is not None:
            try:
                entry = attrs.evolve(entry, architecture=probe(entry))
            except Exception:  # upstream: any failure leaves text in, text out
                entry = attrs.evolve(entry, architecture=Architecture())
        entries.append(entry)
    if not entries:
        # Not an error: upstream's router starts with no models too (a download may add one).
        warnings.append(
            "no models: give --models-dir DIR or --models-preset FILE, or download one "
            "(troupe pull org/repo, POST /models); serving an empty catalog"
        )
    catalog = Catalog(tuple(entries), cwd, tuple(warnings), forced)
    if not reload:
        check_startup(catalog, settings.models_max)
    return catalog
