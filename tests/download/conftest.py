"""The loopback hub, and a repository of tiny real models on it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from troupe.testing.hub import Hub, open_hub, tiny_repo_files


@pytest.fixture
def hub() -> Iterator[Hub]:
    with open_hub() as h:
        yield h


@pytest.fixture(scope="session")
def tiny_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``m-Q4_K_M.gguf``, ``m-Q8_0.gguf`` and ``mmproj-m-F16.gguf`` (~1.3 MB each)."""
    return tiny_repo_files(
        tmp_path_factory.mktemp("repo"), "m-Q4_K_M.gguf", "m-Q8_0.gguf", "mmproj-m-F16.gguf"
    )


@pytest.fixture
def repo(hub: Hub, tiny_files: dict[str, Path]) -> str:
    """``org/tiny`` on the hub, with the tiny files and a README."""
    hub.add_repo("org/tiny", {**tiny_files, "README.md": b"# tiny\n"})
    return "org/tiny"
