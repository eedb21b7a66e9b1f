"""Routers on the fake engine, reached over real sockets."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest

from troupe.testing.router import RouterFactory, RunningRouter, open_router, write_preset


@pytest.fixture
def fake_router(fake_engine_path: Path, tmp_path: Path) -> RouterFactory:
    """``async with fake_router(sections, *args) as router``: the fake engine behind troupe."""

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
