"""Session fixtures shared by the whole suite: the real engine, tiny models, the fake engine."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from troupe.engine import find_engine
from troupe.errors import EngineNotFound

try:
    from troupe_rig import write_fake_engine, write_tiny_models
    from troupe_rig.hub import Hub, open_hub, tiny_repo_files
    from troupe_rig.router import RouterFactory, RunningRouter, open_router, write_preset
except ModuleNotFoundError as exc:  # the rig is a distribution of its own (tests/support)
    if exc.name != "troupe_rig":
        raise
    pytest.exit(
        "the test rig is not installed: pip install -e tests/support (scripts/test does it)",
        returncode=4,
    )

TINY_MODELS = ("tiny-a", "tiny-b", "tiny-c")


@pytest.fixture(scope="session")
def engine_path() -> Path:
    """The real llama-server. Missing is a failure unless TROUPE_ALLOW_NO_ENGINE=1 (then: skip)."""
    try:
        path, _source = find_engine()
    except EngineNotFound as exc:
        if os.environ.get("TROUPE_ALLOW_NO_ENGINE") == "1":
            pytest.skip(f"no llama-server ({exc})")
        pytest.fail(
            f"these tests need the real llama-server: {exc}. "
            "Set TROUPE_ALLOW_NO_ENGINE=1 to skip them instead.",
            pytrace=False,
        )
    return path


def _debian_tool(path: str, package: str, allow_env: str) -> Path:
    """A tool from a Debian package that the project's setup installs (scripts/test)."""
    if Path(path).is_file() and os.access(path, os.X_OK):
        return Path(path)
    if os.environ.get(allow_env) == "1":
        pytest.skip(f"no {path}")
    pytest.fail(
        f"this test needs {path} (apt-get install {package}; scripts/test installs it). "
        f"Set {allow_env}=1 to skip it instead.",
        pytrace=False,
    )


@pytest.fixture(scope="session")
def nginx_path() -> Path:
    return _debian_tool("/usr/sbin/nginx", "nginx", "TROUPE_ALLOW_NO_NGINX")


@pytest.fixture(scope="session")
def haproxy_path() -> Path:
    return _debian_tool("/usr/sbin/haproxy", "haproxy", "TROUPE_ALLOW_NO_HAPROXY")


@pytest.fixture(scope="session")
def chromium_path() -> Path:
    return _debian_tool("/usr/bin/chromium", "chromium", "TROUPE_ALLOW_NO_BROWSER")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with three distinct tiny GGUF models: tiny-a.gguf, tiny-b.gguf, tiny-c.gguf."""
    directory = tmp_path_factory.mktemp("models")
    write_tiny_models(directory, list(TINY_MODELS))
    return directory


@pytest.fixture(scope="session")
def fake_engine_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An executable ``llama-server`` script that runs troupe's fake engine."""
    return write_fake_engine(tmp_path_factory.mktemp("fake-engine"))


@pytest.fixture
def fake_router(fake_engine_path: Path, tmp_path: Path) -> RouterFactory:
    """``async with fake_router(sections, *args) as router``: troupe, in this test's Trio
    run, in front of the fake engine, with a preset of ``{model: {key: value}}``."""

    def factory(
        sections: dict[str, dict[str, str]], *args: str, environ: dict[str, str] | None = None
    ) -> AbstractAsyncContextManager[RunningRouter]:
        preset = write_preset(tmp_path, sections)
        return open_router(
            ["--models-preset", str(preset), *args],
            engine=fake_engine_path,
            state_dir=tmp_path / "state",
            cwd=tmp_path,
            environ=environ,
        )

    return factory


@pytest.fixture
def hub() -> Iterator[Hub]:
    """A Hugging Face-compatible hub on loopback (``troupe_rig.hub``), empty."""
    with open_hub() as h:
        yield h


@pytest.fixture(scope="session")
def tiny_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``m-Q4_K_M.gguf``, ``m-Q8_0.gguf`` and ``mmproj-m-F16.gguf`` (~1.3 MB each; the
    "mmproj" is a tiny llama too, so only for tests that do not load it)."""
    return tiny_repo_files(
        tmp_path_factory.mktemp("repo"), "m-Q4_K_M.gguf", "m-Q8_0.gguf", "mmproj-m-F16.gguf"
    )
