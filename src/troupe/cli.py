"""The ``troupe`` command: argv -> settings -> ``trio.run(service.run)``.

Every failure a user can cause ends with one line on stderr and a non-zero exit;
a traceback means a bug in troupe.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

from troupe import __version__
from troupe.catalog.build import base_preset
from troupe.catalog.render import preset_args
from troupe.child.argcheck import check_child_flags
from troupe.cli_help import SERVE_HELP, TOP_HELP
from troupe.engine import find_engine, probe_engine
from troupe.errors import TroupeError, UsageError
from troupe.ops.logformat import make_formatter
from troupe.prepare import own_flag, prepare_router, split_troupe_flags
from troupe.settings.router import log_format

__all__ = ["main"]

log = logging.getLogger("troupe")

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
    if command == "ps":
        from troupe.commands.ps import run_ps  # noqa: PLC0415

        return run_ps(rest)
    if command == "usage":
        from troupe.commands.usage import run_usage  # noqa: PLC0415

        return run_usage(rest)
    if command == "doctor":
        from troupe.commands.doctor import run_doctor  # noqa: PLC0415

        return run_doctor(rest)
    if command == "pull":
        from troupe.commands.pull import run_pull  # noqa: PLC0415

        return run_pull(rest)
    if command == "import":
        from troupe.commands.importer import run_import  # noqa: PLC0415

        return run_import(rest)
    if command == "cluster":
        from troupe.commands.cluster import run_cluster  # noqa: PLC0415

        return run_cluster(rest)
    raise UsageError(f"unknown command '{command}' (try: troupe --help)")


def _version() -> int:
    print(f"troupe {__version__}")
    try:
        engine = probe_engine(*find_engine())
        print(f"engine {engine.path}: {engine.version}")
    except TroupeError as exc:
        print(f"engine: {exc}")
    return 0


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


def serve(args: Sequence[str]) -> int:
    if any(a in _HELP_FLAGS for a in args):
        print(SERVE_HELP)
        return 0
    own, _ = split_troupe_flags(args)
    level = own_flag(own, "--log-level")
    fmt = own_flag(own, "--log-format") or os.environ.get("TROUPE_LOG_FORMAT", "text")
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
    check_child_flags(engine.path, preset_args(base_preset(settings)))
    log.info(
        "troupe %s, engine %s (%s, from %s)",
        __version__,
        engine.path,
        engine.version,
        engine.source,
    )
    from troupe.service import run_service  # noqa: PLC0415  (imports the web stack)

    return run_service(settings, engine, table)
