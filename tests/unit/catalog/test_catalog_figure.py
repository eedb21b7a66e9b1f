"""A model's context and KV layout, as every figure shows them (troupe.catalog.figure)."""

from __future__ import annotations

from pathlib import Path

import pytest
from catalog_trees import BuildFn

from troupe.catalog.facts import FactsCache
from troupe.catalog.figure import (
    Context,
    child_context,
    estimated_need,
    kv_swa_full,
    with_kv_layout,
)
from troupe_rig import TinyModel, write_tiny_models

# A per-layer pattern: the llama architecture has no SWA rule of its own.
SWA = {
    "llama.attention.sliding_window": 64,
    "llama.attention.sliding_window_pattern": (True, True, True, False),
}


@pytest.fixture
def models(tmp_path: Path) -> Path:
    directory = tmp_path / "models"
    write_tiny_models(
        directory,
        [TinyModel("dense", n_ctx=8192), TinyModel("swa", n_ctx=8192, extra=SWA)],
    )
    return directory


@pytest.mark.parametrize(
    ("cli", "context"),
    [
        ([], Context(8192, "trained; fit may lower it to 4096")),
        (["--ctx-size", "2048"], Context(2048, "ctx-size")),
        (["--ctx-size", "0"], Context(8192, "trained, ctx-size 0")),
        (["--fit", "off"], Context(8192, "trained, fit off")),
        (["--fit-ctx", "16384"], Context(8192, "trained")),
    ],
)
def test_the_context_a_child_starts_with(
    models: Path, build: BuildFn, cli: list[str], context: Context
) -> None:
    cat = build(models_dir="models", cli=cli)
    entry = cat.get("dense")
    assert entry is not None
    assert child_context(entry, FactsCache()) == context


def test_the_kv_store_gives_a_sliding_window_model_swa_full(models: Path, build: BuildFn) -> None:
    cat = build(models_dir="models")
    dense, swa = cat.get("dense"), cat.get("swa")
    assert dense is not None
    assert swa is not None
    facts = FactsCache()
    assert kv_swa_full(swa, facts, kv_store=True)
    assert not kv_swa_full(swa, facts, kv_store=False)
    assert not kv_swa_full(dense, facts, kv_store=True)
    assert with_kv_layout(["a"], swa_full=True) == ["a", "--swa-full"]
    assert with_kv_layout(["a", "--swa-full"], swa_full=True) == ["a", "--swa-full"]
    assert with_kv_layout(["a"], swa_full=False) == ["a"]
    # The estimate the router falls back to is made for that layout: more KV with it.
    full = estimated_need(swa, facts, kv_store=True)
    windowed = estimated_need(swa, facts, kv_store=False)
    assert full is not None
    assert windowed is not None
    assert sum(full.values()) > sum(windowed.values())
