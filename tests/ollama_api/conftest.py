"""Fixtures for the Ollama API tests: troupe in front of the real engine, with the
official ``ollama`` client (its ``AsyncClient`` runs on httpx, so on Trio too)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
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


@pytest.fixture(scope="session")
def gemma_size(gemma_path: Path) -> int:
    return gemma_path.stat().st_size


@pytest.fixture
def real_router(
    engine_path: Path, tiny_model_dir: Path, gemma_path: Path, tmp_path: Path
) -> RouterFactory:
    """``async with real_router(*args, environ=...) as router``: troupe and the real
    llama-server with ``gemma`` (its own template), ``gemma-tools`` (a template with
    tool calls), ``tiny`` (fast gibberish, tagged ``small``) and ``tiny-embed`` (the
    same tiny model started with ``--embeddings``)."""
    sections = {
        "*": {"ctx-size": "2048", "parallel": "1"},
        "gemma": {"model": str(gemma_path)},
        "gemma-tools": {
            "model": str(gemma_path),
            "chat-template-file": str(DATA / "gemma-tools.jinja"),
        },
        "tiny": {"model": str(tiny_model_dir / "tiny-a.gguf"), "ctx-size": "512", "tags": "small"},
        "tiny-embed": {
            "model": str(tiny_model_dir / "tiny-b.gguf"),
            "ctx-size": "512",
            "embeddings": "true",
            "pooling": "mean",
        },
    }

    @asynccontextmanager
    async def factory(
        *args: str, environ: Mapping[str, str] | None = None
    ) -> AsyncIterator[RunningRouter]:
        preset = write_preset(tmp_path, sections)
        async with open_router(
            ["--models-preset", str(preset), *args],
            engine=engine_path,
            state_dir=tmp_path / "state",
            environ=environ if environ is not None else dict(os.environ),
            cwd=tmp_path,
        ) as router:
            yield router

    return factory
