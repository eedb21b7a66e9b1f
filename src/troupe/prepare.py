"""From a command line to what a router runs with: the engine, its option table, settings.

`prepare_router` is what ``troupe serve`` does before it serves, and what ``troupe
doctor`` and ``troupe models`` do to see the catalog ``serve`` would see: find and
probe the engine (or choose among several builds), read the option table, the config
file and the command line. ``-m``/``-hf`` naming a single model means no router: the
argv to exec the engine with instead.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

from troupe.engine import Engine, find_engine, probe_engine
from troupe.errors import EngineNotFound, UsageError
from troupe.hardware import EngineBuild, inspect_build, run_list_devices
from troupe.settings.argv import normalise_flag, parse_engine_args
from troupe.settings.config_file import config_options, load_config
from troupe.settings.options import EngineOption, OptionTable, load_option_table
from troupe.settings.router import (
    TROUPE_OPTIONS,
    RouterSettings,
    build_settings,
    with_router_options,
)
from troupe.settings.table import ENGINE

__all__ = ["engine_args", "inspect_builds", "own_flag", "prepare_router", "split_troupe_flags"]

log = logging.getLogger("troupe")

# Any of these (flag or environment) makes llama-server a single-model server, not a router.
_SINGLE_MODEL_ENVS = (
    "LLAMA_ARG_MODEL",
    "LLAMA_ARG_MODEL_URL",
    "LLAMA_ARG_HF_REPO",
    "LLAMA_ARG_DOCKER_REPO",
)
_HF_REPO_ENV = "LLAMA_ARG_HF_REPO"


def split_troupe_flags(args: Sequence[str]) -> tuple[dict[EngineOption, str], list[str]]:
    """Take troupe's own flags (never forwarded to llama-server) out of ``args``."""
    table = OptionTable(TROUPE_OPTIONS)
    own: dict[EngineOption, str] = {}
    rest: list[str] = []
    i = 0
    while i < len(args):
        found = table.by_spelling(normalise_flag(args[i]))
        if found is None:
            rest.append(args[i])
            i += 1
            continue
        opt = found[0]
        if i + 1 >= len(args):
            raise UsageError(f"flag '{args[i]}' needs a value ({opt.hints[0]})")
        own[opt] = args[i + 1]
        i += 2
    return own, rest


def _is_single_model(cli: dict[EngineOption, str]) -> bool:
    envs = {opt.env for opt, value in cli.items() if value}
    return any(e in envs or os.environ.get(e) for e in _SINGLE_MODEL_ENVS)


def _remote_preset(
    cli: dict[EngineOption, str], table: OptionTable
) -> dict[EngineOption, str] | None:
    """``-hf org/repo`` naming a repository with ``preset.ini`` at its root: the command
    line of a router over that preset (as upstream); None for a model (the engine runs it)."""
    envs = {opt.env: value for opt, value in cli.items() if value}
    if any(e in envs or os.environ.get(e) for e in _SINGLE_MODEL_ENVS if e != _HF_REPO_ENV):
        return None
    hf_repo = envs.get(_HF_REPO_ENV) or os.environ.get(_HF_REPO_ENV, "")
    if not hf_repo:
        return None
    from troupe.download.hubapi import hf_token  # noqa: PLC0415  (network code, only here)
    from troupe.download.remote_preset import fetch_remote_preset, warn_remote_preset  # noqa: PLC0415

    offline = envs.get("LLAMA_ARG_OFFLINE", os.environ.get("LLAMA_ARG_OFFLINE", "0")) not in (
        "0",
        "false",
        "",
    )
    token = hf_token(os.environ, envs.get("HF_TOKEN"))
    path = fetch_remote_preset(hf_repo, os.environ, token, offline=offline)
    if path is None:
        return None
    warn_remote_preset(hf_repo)
    found = table.by_spelling("--models-preset")
    assert found is not None
    # The model fields are cleared: children must not inherit -hf from the command line
    # or from the environment the router passes on.
    os.environ.pop(_HF_REPO_ENV, None)
    out = {opt: value for opt, value in cli.items() if opt.env != _HF_REPO_ENV}
    out[found[0]] = str(path)
    return out


def prepare_router(args: Sequence[str]) -> tuple[Engine, OptionTable, RouterSettings] | list[str]:
    """Resolve engine, option table and settings; or the argv to exec for single-model mode."""
    own, rest = split_troupe_flags(args)
    config_path = own_flag(own, "--config") or os.environ.get("TROUPE_CONFIG")
    config = load_config(Path(config_path)) if config_path else None
    engines = _all_values(args, "--engine")
    if len(engines) > 1:
        engine = _choose_among(engines)
    else:
        in_file = config.get(ENGINE) if config else None
        engine_flag = own_flag(own, "--engine") or (None if in_file is None else str(in_file))
        engine = probe_engine(*find_engine(engine_flag))
    table = with_router_options(load_option_table(engine.path))
    cli = parse_engine_args(rest, table)
    if _is_single_model(cli):
        preset_cli = _remote_preset(cli, table)
        if preset_cli is None:
            return [str(engine.path), *rest]
        cli = preset_cli
    file_opts: dict[EngineOption, str] = {}
    file_own: dict[EngineOption, str] = {}
    if config is not None and config_path is not None:
        file_opts, file_own = config_options(config, table, Path(config_path).resolve().parent)
    settings = build_settings(table, cli, own, os.environ, file_opts, file_own)
    return engine, table, settings


def _all_values(args: Sequence[str], flag: str) -> list[str]:
    return [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]


def _choose_among(specs: list[str]) -> Engine:
    """Several ``--engine [LABEL=]PATH`` builds: the best one this machine can run."""
    from troupe.hardware.devices import read_devices  # noqa: PLC0415
    from troupe.hardware.engines import HostFacts, choose_engine  # noqa: PLC0415

    engines, _ = engine_args([word for spec in specs for word in ("--engine", spec)])
    builds, _versions = inspect_builds(engines)
    choice = choose_engine(builds, HostFacts.detect(read_devices().gpu_report))
    if choice.build is None:
        raise EngineNotFound(
            f"none of the {len(specs)} engine builds can run here: {choice.reason}"
        )
    log.info("engine build chosen: %s (%s)", choice.build.path, choice.reason)
    return probe_engine(choice.build.path, "--engine")


def own_flag(own: dict[EngineOption, str], spelling: str) -> str | None:
    return next((v for o, v in own.items() if o.long_name == spelling), None)


def engine_args(args: Sequence[str]) -> tuple[list[tuple[str | None, str]], list[str]]:
    """Every ``--engine [LABEL=]PATH`` (label, path), and the other arguments."""
    engines: list[tuple[str | None, str]] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        if args[i] != "--engine":
            rest.append(args[i])
            i += 1
            continue
        if i + 1 >= len(args):
            raise UsageError("flag '--engine' needs a value ([LABEL=]PATH)")
        label, sep, path = args[i + 1].partition("=")
        # a label never holds a slash, so "/opt/a=b/llama-server" stays a path
        engines.append((label, path) if sep and label and "/" not in label else (None, args[i + 1]))
        i += 2
    return engines, rest


def inspect_builds(
    engines: list[tuple[str | None, str]],
) -> tuple[list[EngineBuild], dict[Path, str]]:
    """Inspect every build; versions (or why `--version` failed) by path."""
    if engines:
        found = [(label, *find_engine(path)) for label, path in engines]  # bad path: error
    else:
        path, source = find_engine()
        found = [(source, path, source)]
    builds, versions = [], {}
    for label, path, source in found:
        builds.append(inspect_build(path, label or source, list_devices=run_list_devices))
        try:
            versions[path] = probe_engine(path, source).version
        except EngineNotFound as exc:
            versions[path] = f"unknown ({exc})"
    return builds, versions
