"""Child flags checked by the engine's own parser before troupe serves them.

``llama-server ARGS --version`` parses ``ARGS`` in order with the engine's own argument
parser, then ``--version`` prints the build and exits 0 (nothing is loaded). A value it
would refuse (``--ctx-size abc``) fails there with the engine's message, so the router
refuses it up front instead of accepting the flag and failing the first request with a
500. The rules stay the engine's: troupe copies none of them.

Two checks: the router's own command line (`check_child_flags`, before anything
starts), and each model's whole child command line where its preset section adds
flags of its own (`SectionChecks`: run concurrently, cached by argv, so a reload that
changes one section runs one check).
"""

from __future__ import annotations

import logging
import subprocess
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from troupe.errors import ConfigError

__all__ = ["SectionChecks", "check_child_flags", "engine_refusal"]

log = logging.getLogger("troupe.specs")

CHECK_TIMEOUT = 30.0  # seconds: the engine only parses; a hang here is the engine's bug
CHECK_WORKERS = 4  # engine processes at once (each only parses its arguments)


class CheckFailed(Exception):
    """The engine could not be asked (not a refusal of the flags)."""


def _engine_error(text: str) -> str:
    """The engine's one line of complaint, from everything it printed."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in lines:
        if line.lower().startswith("error"):
            return line
    return lines[-1] if lines else "no message"


def engine_refusal(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str | None:
    """The engine's message when it refuses ``argv`` (binary first), else None;
    `CheckFailed` when it could not be run."""
    try:
        done = subprocess.run(
            [*argv, "--version"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=CHECK_TIMEOUT,
            stdin=subprocess.DEVNULL,
            env=None if env is None else dict(env),
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CheckFailed(str(exc)) from None
    if done.returncode != 0:
        return _engine_error(done.stderr + "\n" + done.stdout)
    return None


def check_child_flags(engine: Path, args: Sequence[str]) -> None:
    """ConfigError with the engine's own message when it refuses ``args``."""
    if not args:
        return
    try:
        message = engine_refusal([str(engine), *args])
    except CheckFailed as exc:
        raise ConfigError(f"cannot check the child flags with {engine}: {exc}") from None
    if message is not None:
        raise ConfigError(f"the engine refuses the child flags: {message}")


class SectionChecks:
    """Each model's child command line, checked by the engine; results by argv (only
    the current catalog's are kept). Thread-safe: scans run in worker threads."""

    def __init__(self, env: Mapping[str, str] | None = None, workers: int = CHECK_WORKERS):
        self._env = env
        self._workers = workers
        self._lock = threading.Lock()
        self._known: dict[tuple[str, ...], str | None] = {}

    def _ask(self, argv: tuple[str, ...]) -> str | None:
        try:
            return engine_refusal(argv, self._env)
        except CheckFailed as exc:  # not the flags' fault: the child's start will say more
            log.warning("could not check the flags of %s: %s", " ".join(argv[:1]), exc)
            return None

    def refusals(self, argvs: Mapping[str, Sequence[str]]) -> dict[str, str]:
        """The engine's message for each model whose command line it refuses."""
        wanted = {name: tuple(argv) for name, argv in argvs.items()}
        with self._lock:
            known = {a: self._known[a] for a in set(wanted.values()) if a in self._known}
            todo = [a for a in dict.fromkeys(wanted.values()) if a not in known]
            if todo:
                with ThreadPoolExecutor(min(self._workers, len(todo))) as pool:
                    known.update(zip(todo, pool.map(self._ask, todo), strict=True))
            self._known = known  # a reload's stale lines go
        return {name: msg for name, argv in wanted.items() if (msg := known[argv]) is not None}
