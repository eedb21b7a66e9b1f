"""Fixtures for the catalog tests: the real option table (from a --help snapshot),
HF cache trees, and a one-call catalog builder."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from catalog_trees import HELP_SNAPSHOT, BuildFn

from troupe.catalog import Catalog, build_catalog
from troupe.settings.argv import parse_engine_args
from troupe.settings.options import OptionTable, parse_help
from troupe.settings.router import RouterSettings, with_router_options


@pytest.fixture(scope="session")
def table() -> OptionTable:
    return with_router_options(parse_help(HELP_SNAPSHOT.read_text()))


@pytest.fixture
def build(tmp_path: Path, table: OptionTable) -> BuildFn:
    """``build(ini=..., cli=[...], models_dir="models", env={...}, reload=False)``.

    The working directory is ``tmp_path``; the HF cache is ``tmp_path/cache``
    (``LLAMA_CACHE``) unless ``env`` says otherwise.
    """

    def run(
        *,
        ini: str | None = None,
        cli: Sequence[str] = (),
        models_dir: str | None = None,
        env: Mapping[str, str] | None = None,
        reload: bool = False,
        models_max: int = 4,
        **kwargs: object,
    ) -> Catalog:
        args = list(cli)
        preset_path = None
        if ini is not None:
            (tmp_path / "presets.ini").write_bytes(ini.encode())
            preset_path = Path("presets.ini")
            args += ["--models-preset", "presets.ini"]
        if models_dir is not None:
            args += ["--models-dir", models_dir]
        parsed = parse_engine_args(args, table)
        settings = RouterSettings(
            models_dir=Path(models_dir) if models_dir is not None else None,
            models_preset=preset_path,
            models_max=models_max,
            base_args=tuple(parsed.items()),
        )
        environ = {"LLAMA_CACHE": str(tmp_path / "cache")} if env is None else dict(env)
        return build_catalog(settings, table, environ, tmp_path, reload=reload, **kwargs)  # type: ignore[arg-type]

    return run
