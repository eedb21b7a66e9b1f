"""troupe and the C++ router side by side, idle, over the same models directory.

``troupe serve`` and ``llama-server --models-dir`` (router mode), each its own
process started the same way, neither loading a model: what the benches that
measure the routers themselves (their own routes, their memory at rest) compare.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

from _util import Proc, start_process
from troupe_rig import write_tiny_models

__all__ = ["ROUTERS", "start_pair"]

ROUTERS = ("troupe", "C++ router")


def start_pair(
    stack: contextlib.ExitStack, engine: Path, tmp: Path, models: int = 2
) -> dict[str, tuple[Proc, str]]:
    """Both routers over ``models`` tiny GGUF files; ``{name: (process, url)}`` once each
    listens (a router answers ``/health`` as soon as it is listening)."""
    models_dir = tmp / "models"
    write_tiny_models(models_dir, models)
    host = ["--host", "127.0.0.1", "--port", "0"]
    env = dict(os.environ)
    env.pop("LLAMA_SERVER_ROUTER_PORT", None)
    commands = {
        "troupe": [sys.executable, "-m", "troupe", "serve", "--engine", str(engine),
                   "--state-dir", str(tmp / "state"), "--models-dir", str(models_dir), *host],
        "C++ router": [str(engine), "--models-dir", str(models_dir), *host],
    }  # fmt: skip
    out: dict[str, tuple[Proc, str]] = {}
    for name, argv in commands.items():
        proc = start_process(name, argv, tmp, env)
        stack.callback(proc.stop, 15.0)
        out[name] = (proc, "")
    for name, (proc, _) in out.items():
        out[name] = (proc, proc.wait_listening(60))
    return out
