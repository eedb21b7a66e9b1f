"""The ``troupe`` command: argv -> settings -> ``trio.run(service.run)``.

Every failure a user can cause ends with one line on stderr and a non-zero exit;
a traceback means a bug in troupe.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from troupe import __version__
from troupe.cli_help import SERVE_HELP, TOP_HELP
from troupe.engine import Engine, find_engine, probe_engine
from troupe.errors import EngineNotFound, TroupeError, UsageError
from troupe.ops.logformat import make_formatter
from troupe.settings.argv import normalise_flag, parse_engine_args
from troupe.settings.config_file import config_options, load_config
from troupe.settings.options import EngineOption, OptionTable, load_option_table
from troupe.settings.router import (
    TROUPE_OPTIONS,
    RouterSettings,
    build_settings,
    log_format,
    with_router_options,
)

__all__ = ["main"]

log = logging.getLogger("troupe")

# Any of these (flag or environment) makes llama-server a single-model server, not a router.
_SINGLE_MODEL_ENVS = (
    "LLAMA_ARG_MODEL",
    "LLAMA_ARG_MODEL_URL",
    "LLAMA_ARG_HF_REPO",
    "LLAMA_ARG_DOCKER_REPO",
)
_HF_REPO_ENV = "LLAMA_ARG_HF_REPO"
_HELP_FLAGS = ("-h", "--help", "--usage")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(args)
    except TroupeError as exc:
        print(f"troupe: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


def _main(args: list[str]) -> int:
    if not args or args[0] in _HELP_FLAGS:
        print(TOP_HELP)
        return 0 if args else 2
    if args[0] == "--version":
        return _version()
    command, rest = args[0], args[1:]
    if command.startswith("-"):
        command, rest = "serve", args  # `troupe --models-dir ...` reads like llama-server
    if command == "serve":
        return serve(rest)
    if command == "models":
        from troupe.commands.models import run_models  # noqa: PLC0415  (keeps start-up lean)

        return run_models(rest)
    if command == "doctor":
        from troupe.commands.doctor import run_doctor  # noqa: PLC0415

        return run_doctor(rest)
    if command == "pull":
        from troupe.commands.pull import run_pull  # noqa: PLC0415

        return run_pull(rest)
    if command == "import":
        from troupe.commands.importer import run_import  # noqa: PLC0415

        return run_import(rest)
    raise UsageError(f"unknown command '{command}' (try: troupe --help)")


def _version() -> int:
    print(f"troupe {__version__}")
    try:
        engine = probe_engine(*find_engine())
        print(f"engine {engine.path}: {engine.version}")
    except TroupeError as exc:
        print(f"engine: {exc}")
    return 0


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


def setup_logging(level: str, fmt: str = "text") -> None:
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise UsageError(f"invalid value for --log-level: '{level}' (debug, info, warning, error)")
    root = logging.getLogger()
    root.setLevel(numeric)
    for noisy in ("httpx", "httpcore", "hpack"):  # a line per proxied request is too much
        logging.getLogger(noisy).setLevel(max(numeric, logging.WARNING))
    formatter = make_formatter(log_format(fmt))
    ours = [h for h in root.handlers if getattr(h, "troupe_handler", False)]
    if not root.handlers:  # as basicConfig: leave a host's own logging alone
        stream = logging.StreamHandler(sys.stderr)
        stream.troupe_handler = True  # type: ignore[attr-defined]
        ours = [stream]
        root.addHandler(stream)
    for handler in ours:
        handler.setFormatter(formatter)  # the config file may change the format later


def _is_single_model(cli: dict[EngineOption, str]) -> bool:
    envs = {opt.env for opt, value in cli.items() if value}
    return any(e in envs or os.environ.get(e) for e in _SINGLE_MODEL_ENVS)


def _remote_preset(
    cli: dict[EngineOption, str], table: OptionTable
) -> dict[EngineOption, str] | None:
    """``-hf org/repo`` naming a repository with ``preset.ini`` at its root: the command
    line of a router over that preset (spec §1.1); None for a model (the engine runs it)."""
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
    config_path = _own_flag(own, "--config") or os.environ.get("TROUPE_CONFIG")
    config = load_config(Path(config_path)) if config_path else None
    engines = _all_values(args, "--engine")
    if len(engines) > 1:
        engine = _choose_among(engines)
    else:
        engine_flag = _own_flag(own, "--engine") or (config.troupe.engine if config else None)
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
    from troupe.commands.doctor import engine_args, inspect_builds  # noqa: PLC0415
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


def _own_flag(own: dict[EngineOption, str], spelling: str) -> str | None:
    return next((v for o, v in own.items() if o.long_name == spelling), None)


def serve(args: Sequence[str]) -> int:
    if any(a in _HELP_FLAGS for a in args):
        print(SERVE_HELP)
        return 0
    own, _ = split_troupe_flags(args)
    level = _own_flag(own, "--log-level")
    fmt = _own_flag(own, "--log-format") or os.environ.get("TROUPE_LOG_FORMAT", "text")
    setup_logging(level or os.environ.get("TROUPE_LOG_LEVEL", "info"), fmt)
    prepared = prepare_router(args)
    if isinstance(prepared, list):
        # Not a router: llama-server itself serves the one model, with the same arguments.
        log.info("a model was given: running the engine directly: %s", " ".join(prepared))
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(prepared[0], prepared)
    engine, table, settings = prepared
    setup_logging(settings.log_level, settings.log_format)  # the config file may set them too
    log.info(
        "troupe %s, engine %s (%s, from %s)",
        __version__,
        engine.path,
        engine.version,
        engine.source,
    )
    from troupe.service import run_service  # noqa: PLC0415  (imports the web stack)

    return run_service(settings, engine, table)
