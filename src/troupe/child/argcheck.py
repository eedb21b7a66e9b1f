"""Child flags checked by the engine's own parser before troupe serves.

``llama-server ARGS --version`` parses ``ARGS`` in order with the engine's own argument
parser, then ``--version`` prints the build and exits 0 (nothing is loaded). A value it
would refuse (``--ctx-size abc``) fails there with the engine's message, so the router
refuses to start with that message instead of accepting the flag and failing the first
request with a 500. The rules stay the engine's: troupe copies none of them.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from troupe.errors import ConfigError

__all__ = ["check_child_flags"]

CHECK_TIMEOUT = 30.0  # seconds: the engine only parses; a hang here is the engine's bug


def _engine_error(text: str) -> str:
    """The engine's one line of complaint, from everything it printed."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in lines:
        if line.lower().startswith("error"):
            return line
    return lines[-1] if lines else "no message"


def check_child_flags(engine: Path, args: Sequence[str]) -> None:
    """ConfigError with the engine's own message when it refuses ``args``."""
    if not args:
        return
    try:
        done = subprocess.run(
            [str(engine), *args, "--version"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=CHECK_TIMEOUT,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"cannot check the child flags with {engine}: {exc}") from None
    if done.returncode != 0:
        message = _engine_error(done.stderr + "\n" + done.stdout)
        raise ConfigError(f"the engine refuses the child flags: {message}")
