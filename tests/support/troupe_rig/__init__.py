"""Test rig: tiny real GGUF models, a fault-injecting fake engine, process helpers.

Importable by the test suite and by ``bench/``. Nothing here is used by troupe at run
time, and none of it ships in troupe's wheel: it is its own small distribution
(``tests/support/pyproject.toml``) that ``scripts/_venv.sh`` installs beside troupe.
"""

from __future__ import annotations

import importlib
import os
import shlex
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from troupe_rig.engine_process import (
        EngineExited,
        EngineProcess,
        free_port,
        open_engine,
    )
    from troupe_rig.mixed_engine import write_mixed_engine
    from troupe_rig.tiny_gguf import TinyModel, write_tiny_gguf, write_tiny_models

__all__ = [
    "EngineExited",
    "EngineProcess",
    "TinyModel",
    "fake_engine_argv",
    "free_port",
    "open_engine",
    "write_fake_engine",
    "write_mixed_engine",
    "write_tiny_gguf",
    "write_tiny_models",
]

_ROOT = Path(__file__).resolve().parents[1]  # the directory that holds the troupe_rig package

# Imported on first use: the fake engine runs as ``python -m troupe_rig.fake_engine``,
# which imports this package, and numpy (for the GGUF writer) would add ~0.25 s to its start.
_LAZY = {
    "EngineExited": "engine_process",
    "EngineProcess": "engine_process",
    "free_port": "engine_process",
    "open_engine": "engine_process",
    "TinyModel": "tiny_gguf",
    "write_tiny_gguf": "tiny_gguf",
    "write_tiny_models": "tiny_gguf",
    "write_mixed_engine": "mixed_engine",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def fake_engine_argv() -> list[str]:
    """The command that runs the fake engine with this interpreter."""
    return [sys.executable, "-m", "troupe_rig.fake_engine"]


def write_fake_engine(
    directory: str | os.PathLike[str],
    name: str = "llama-server",
    env: Mapping[str, str] | None = None,
) -> Path:
    """Write an executable script that runs the fake engine, for where an engine *path* is wanted.

    ``env`` is baked into the script (e.g. ``{"TROUPE_FAKE_LOAD_TIME": "1"}``) so one
    launcher can stand for an engine that always misbehaves the same way; command-line
    knobs still override it. The script also puts the rig's own directory on
    ``PYTHONPATH``, so it works whether the rig is installed or not.
    """
    from troupe_rig.fake_engine.responses import VERSION  # noqa: PLC0415  (the fake's own)

    path = Path(directory) / name
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in (env or {}).items())
    script = (
        "#!/bin/sh\n"
        "# fake llama-server for troupe's tests (troupe_rig.write_fake_engine)\n"
        f'export PYTHONPATH={shlex.quote(str(_ROOT))}"${{PYTHONPATH:+:$PYTHONPATH}}"\n'
        f"{exports}"
        # `ARGS... --version` is troupe's check of a model's flags: the fake refuses no
        # value, so it answers at once (a Python start-up per section slows every router).
        'if [ "$#" -gt 1 ]; then eval "last=\\${$#}"; if [ "$last" = "--version" ]; then\n'
        f"  printf 'version: {VERSION} (build 0, commit fake)\\nbuilt with fake for Linux\\n' >&2\n"
        "  exit 0\nfi; fi\n"
        f'exec {" ".join(shlex.quote(a) for a in fake_engine_argv())} "$@"\n'
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(script)
    tmp.chmod(0o755)
    tmp.replace(path)
    return path
