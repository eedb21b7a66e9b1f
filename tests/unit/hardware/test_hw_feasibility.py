"""GREEN / YELLOW / RED (Jan's rule) and the estimate that feeds it."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from troupe.catalog.preset import Preset
from troupe.gguf import ModelFacts, kv_cache_bytes, read_model_facts
from troupe.hardware import (
    RESERVE,
    Feasibility,
    context_for,
    estimate_memory,
    feasibility,
    format_bytes,
)
from troupe.settings.options import EngineOption
from troupe_rig import TinyModel, write_tiny_gguf

GIB = 1024**3
G, Y, R = Feasibility.GREEN, Feasibility.YELLOW, Feasibility.RED

# -- Apple Silicon branch: the worked examples in Jan's code ------------------------------


@pytest.mark.parametrize(
    ("total_gib", "usable"),
    [(8, 5_046_586_573), (16, 12_777_527_706), (32, 28_239_409_972)],
)
def test_unified_memory_worked_examples(total_gib: int, usable: int) -> None:
    ram = total_gib * GIB
    assert feasibility(usable, ram_total=ram, unified=True).usable_total == usable
    assert feasibility(usable + 1, ram_total=ram, unified=True).colour is R
    assert feasibility(usable, ram_total=ram, unified=True).colour is Y  # equal: YELLOW
    assert feasibility(usable * 85 // 100, ram_total=ram, unified=True).colour is G
    assert feasibility(usable * 85 // 100 + 1, ram_total=ram, unified=True).colour is Y


# -- no GPU: RAM plays the GPU's part ---------------------------------------------------------


def test_cpu_only_is_green_or_red_never_yellow() -> None:
    ram = 16 * GIB
    usable = ram - RESERVE
    fit = feasibility(usable, ram_total=ram)
    assert (fit.colour, fit.usable_vram, fit.usable_total) == (G, usable, usable)
    assert feasibility(usable + 1, ram_total=ram).colour is R
    assert feasibility(0, ram_total=ram).colour is G


def test_tiny_host() -> None:
    assert feasibility(1, ram_total=RESERVE).colour is R  # nothing left after the reserve
    assert feasibility(0, ram_total=RESERVE).colour is G


# -- GPUs plus RAM --------------------------------------------------------------------------------


def test_gpu_then_hybrid_then_red() -> None:
    ram, gpu = 32 * GIB, 8 * GIB
    vram_usable = gpu - RESERVE
    total_usable = (ram - RESERVE) + vram_usable
    assert feasibility(vram_usable, ram_total=ram, gpu_totals=[gpu]).colour is G
    assert feasibility(vram_usable + 1, ram_total=ram, gpu_totals=[gpu]).colour is Y
    assert feasibility(total_usable, ram_total=ram, gpu_totals=[gpu]).colour is Y
    assert feasibility(total_usable + 1, ram_total=ram, gpu_totals=[gpu]).colour is R


def test_gpus_are_summed_with_one_reserve() -> None:
    fit = feasibility(29 * GIB, ram_total=64 * GIB, gpu_totals=[16 * GIB, 16 * GIB])
    assert fit.usable_vram == 32 * GIB - RESERVE
    assert fit.colour is G


def test_ram_under_the_reserve_adds_nothing() -> None:
    fit = feasibility(7 * GIB, ram_total=RESERVE, gpu_totals=[8 * GIB])
    assert fit.usable_total == fit.usable_vram == 8 * GIB - RESERVE
    assert fit.colour is R


def test_negative_requirement_is_a_bug() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        feasibility(-1, ram_total=GIB)


@given(
    a=st.integers(0, 2**40),
    b=st.integers(0, 2**40),
    ram=st.integers(0, 2**40),
    gpus=st.lists(st.integers(0, 2**38), max_size=4),
)
def test_more_memory_needed_never_improves_the_colour(
    a: int, b: int, ram: int, gpus: list[int]
) -> None:
    order = {G: 0, Y: 1, R: 2}
    lo, hi = sorted((a, b))
    assert (
        order[feasibility(lo, ram_total=ram, gpu_totals=gpus).colour]
        <= order[feasibility(hi, ram_total=ram, gpu_totals=gpus).colour]
    )


def test_explain() -> None:
    assert feasibility(GIB, ram_total=16 * GIB).explain().startswith("1.0 GiB fits in the")
    yellow = feasibility(8 * GIB, ram_total=32 * GIB, gpu_totals=[8 * GIB]).explain()
    assert "spills into host RAM" in yellow
    assert "usable in all" in feasibility(64 * GIB, ram_total=16 * GIB).explain()


@pytest.mark.parametrize(
    ("n", "text"),
    [(None, "?"), (0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (3 * GIB, "3.0 GiB"),
     (2 * 1024 * GIB, "2.0 TiB")],
)  # fmt: skip
def test_format_bytes(n: int | None, text: str) -> None:
    assert format_bytes(n) == text


# -- the estimate: which context, which KV options ------------------------------------------


def _opt(*spellings: str, env: str, value: bool = True) -> EngineOption:
    return EngineOption(spellings=spellings, hints=("N",) if value else (), env=env)


CTX = _opt("-c", "--ctx-size", env="LLAMA_ARG_CTX_SIZE")
FIT = _opt("-fit", "--fit", env="LLAMA_ARG_FIT")
FIT_CTX = _opt("-fitc", "--fit-ctx", env="LLAMA_ARG_FIT_CTX")
PARALLEL = _opt("-np", "--parallel", env="LLAMA_ARG_N_PARALLEL")
CTK = _opt("-ctk", "--cache-type-k", env="LLAMA_ARG_CACHE_TYPE_K")
KVU = _opt("-kvu", "--kv-unified", env="LLAMA_ARG_KV_UNIFIED", value=False)


def preset(*options: tuple[EngineOption, str]) -> Preset:
    return Preset("m", options=options)


@pytest.fixture(scope="module")
def facts_8k(tmp_path_factory: pytest.TempPathFactory) -> ModelFacts:
    path = write_tiny_gguf(tmp_path_factory.mktemp("m") / "t.gguf", TinyModel("t", n_ctx=8192))
    return read_model_facts(path)


@pytest.mark.parametrize(
    ("options", "n_ctx", "why"),
    [
        ((), 4096, "fit-ctx, the least fit may choose"),
        (((FIT_CTX, "2048"),), 2048, "fit-ctx, the least fit may choose"),
        (((FIT_CTX, "16384"),), 8192, "trained, within fit-ctx 16384"),
        (((CTX, "1000"),), 1000, "ctx-size"),
        (((CTX, "0"),), 8192, "trained, ctx-size 0"),
        (((FIT, "off"),), 8192, "trained, fit off"),
        (((FIT, "off"), (CTX, "512")), 512, "ctx-size"),
    ],
)
def test_context_choice(
    facts_8k: ModelFacts, options: tuple[tuple[EngineOption, str], ...], n_ctx: int, why: str
) -> None:
    assert context_for(preset(*options), facts_8k) == (n_ctx, why)


def test_estimate_sums_weights_kv_and_projector(facts_8k: ModelFacts) -> None:
    est = estimate_memory(preset(), facts_8k, mmproj_bytes=1000)
    assert est.n_ctx == 4096
    assert est.weights == facts_8k.tensor_bytes
    assert est.kv_cache == kv_cache_bytes(facts_8k, 4096, 4, unified=True)
    assert est.total == est.weights + est.kv_cache + 1000


def test_estimate_follows_cache_type_and_parallel(facts_8k: ModelFacts) -> None:
    f16 = estimate_memory(preset((CTX, "4096")), facts_8k).kv_cache
    q8 = estimate_memory(preset((CTX, "4096"), (CTK, "q8_0")), facts_8k).kv_cache
    assert q8 < f16
    split = estimate_memory(preset((CTX, "4096"), (PARALLEL, "2")), facts_8k)
    assert split.kv_cache == kv_cache_bytes(facts_8k, 4096, 2, unified=False)
    shared = estimate_memory(preset((CTX, "4096"), (PARALLEL, "2"), (KVU, "1")), facts_8k)
    assert shared.kv_cache == kv_cache_bytes(facts_8k, 4096, 2, unified=True)


@pytest.mark.parametrize(
    "options",
    [((CTX, "big"),), ((CTK, "q3_k"),)],
)
def test_bad_options_are_value_errors(
    facts_8k: ModelFacts, options: tuple[tuple[EngineOption, str], ...]
) -> None:
    with pytest.raises(ValueError):  # noqa: PT011  (either message is fine)
        estimate_memory(preset(*options), facts_8k)


def test_unknown_trained_context(tmp_path: Path) -> None:
    spec = TinyModel("nctx", extra=(("llama.context_length", "none"),))
    facts = read_model_facts(write_tiny_gguf(tmp_path / "n.gguf", spec))
    assert facts.context_length is None
    assert context_for(preset(), facts) == (4096, "fit-ctx, the least fit may choose")
    with pytest.raises(ValueError, match="trained context"):
        context_for(
            preset(
                (FIT, "off"),
            ),
            facts,
        )
