"""Fixtures for the realtime tests: troupe in front of the real engine, tiny and demo models."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from troupe.demo import assemble_demo_model
from troupe_rig.router import RouterFactory, RunningRouter, open_router, write_preset

DATA = Path(__file__).parent.parent / "data"


@pytest.fixture(scope="session")
def gemma_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Gemma 3 270M (the demo model, from the ``demo`` extra): a real chat template."""
    return assemble_demo_model(tmp_path_factory.mktemp("demo-model"))


@pytest.fixture
def real_router(
    engine_path: Path, tiny_model_dir: Path, gemma_path: Path, tmp_path: Path
) -> RouterFactory:
    """``async with real_router(*args) as router``: troupe and the real llama-server, with
    ``tiny`` (a tiny model: fast gibberish), ``gemma`` (its own template) and
    ``gemma-tools`` (the same model with a template that has tool calls)."""
    sections = {
        "*": {"ctx-size": "2048", "parallel": "1"},
        "tiny": {"model": str(tiny_model_dir / "tiny-a.gguf"), "ctx-size": "512"},
        "gemma": {"model": str(gemma_path)},
        "gemma-tools": {
            "model": str(gemma_path),
            "chat-template-file": str(DATA / "gemma-tools.jinja"),
        },
    }

    @asynccontextmanager
    async def factory(*args: str) -> AsyncIterator[RunningRouter]:
        preset = write_preset(tmp_path, sections)
        async with open_router(
            ["--models-preset", str(preset), *args],
            engine=engine_path,
            state_dir=tmp_path / "state",
            cwd=tmp_path,
        ) as router:
            yield router

    return factory
