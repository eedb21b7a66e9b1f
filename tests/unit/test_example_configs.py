"""The files in configs/ are examples users copy: they must stay valid."""

from __future__ import annotations

from pathlib import Path

import pytest

from troupe.catalog import build_catalog
from troupe.settings.config_file import config_options, load_config
from troupe.settings.options import OptionTable, parse_help
from troupe.settings.router import build_settings, with_router_options

ROOT = Path(__file__).resolve().parents[2]
HELP = ROOT / "tests" / "data" / "llama-server-help.txt"


@pytest.fixture(scope="module")
def table() -> OptionTable:
    return with_router_options(parse_help(HELP.read_text()))


def test_router_config_and_its_presets(table: OptionTable, tmp_path: Path) -> None:
    path = ROOT / "configs" / "troupe.toml"
    opts, own = config_options(load_config(path), table, path.parent)
    settings = build_settings(table, {}, {}, {"TROUPE_STATE_DIR": str(tmp_path)}, opts, own)
    assert settings.queue_max == 64
    assert settings.memory_margin_bytes == 1024 << 20
    catalog = build_catalog(settings, table, {}, ROOT, reload=False)
    assert {e.name for e in catalog} == {"chat", "coder", "embed"}
    chat = catalog.get("chat")
    assert chat is not None
    assert chat.pin
    assert chat.sorted_aliases == ("default", "gpt-4o-mini")
    assert catalog.startup_models() == ("embed",)
    # The two files together: each model gets the context its preset section gives it,
    # not one the router config forces on all.
    ctx = {e.name: e.preset.get("LLAMA_ARG_CTX_SIZE") for e in catalog}
    assert ctx == {"chat": "8192", "coder": "8192", "embed": "2048"}


def test_demo_preset(table: OptionTable) -> None:
    settings = build_settings(
        table, {}, {}, {"LLAMA_ARG_MODELS_PRESET": str(ROOT / "configs" / "demo.ini")}
    )
    catalog = build_catalog(settings, table, {}, ROOT)
    assert catalog.names == ("gemma-3-270m",)
    entry = catalog.get("gemma-3-270m")
    assert entry is not None
    assert entry.sorted_aliases == ("gemma",)
    # Gemma's own chat format (the GGUF has none) and a bound on an answer's length.
    template = entry.preset.get("LLAMA_ARG_CHAT_TEMPLATE_FILE")
    assert template == "configs/gemma3-chat.jinja"
    assert "<start_of_turn>" in (ROOT / template).read_text()
    assert entry.preset.get("LLAMA_ARG_N_PREDICT") == "256"
