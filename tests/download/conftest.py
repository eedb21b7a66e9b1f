"""A repository of tiny real models on the loopback hub (see tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from troupe_rig.hub import Hub


@pytest.fixture
def repo(hub: Hub, tiny_files: dict[str, Path]) -> str:
    """``org/tiny`` on the hub, with the tiny files and a README."""
    hub.add_repo("org/tiny", {**tiny_files, "README.md": b"# tiny\n"})
    return "org/tiny"
