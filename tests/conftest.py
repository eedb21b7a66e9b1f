"""Session fixtures shared by the whole suite: the real engine, tiny models, the fake engine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from troupe.engine import find_engine
from troupe.errors import EngineNotFound
from troupe.testing import write_fake_engine, write_tiny_models

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
