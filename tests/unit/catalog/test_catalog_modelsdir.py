"""The --models-dir scan (common/preset.cpp load_from_models_dir)."""

from __future__ import annotations

from pathlib import Path

import pytest
from catalog_trees import touch

from troupe.catalog.modelsdir import LocalModel, scan_models_dir
from troupe.errors import ConfigError


def test_top_level_files(tmp_path: Path) -> None:
    touch(
        tmp_path,
        "a.gguf",
        "b.gguf.gguf",
        "mmproj-a.gguf",
        "a-mmproj.gguf",
        "mtp-a.gguf",
        "dspark-a.gguf",
        "dflash-a.gguf",
        "eagle3-a.gguf",  # not a draft prefix here: a model of its own
        "notes.txt",
        "UPPER.GGUF",
        "big-00001-of-00002.gguf",
        "big-00002-of-00002.gguf",
    )
    found = scan_models_dir("models", tmp_path)
    assert found == {
        "a": LocalModel("a", "models/a.gguf"),
        "b": LocalModel("b", "models/b.gguf.gguf"),
        "eagle3-a": LocalModel("eagle3-a", "models/eagle3-a.gguf"),
        # top-level shards are not grouped: each is a model
        "big-00001-of-00002": LocalModel("big-00001-of-00002", "models/big-00001-of-00002.gguf"),
        "big-00002-of-00002": LocalModel("big-00002-of-00002", "models/big-00002-of-00002.gguf"),
    }


def test_sub_directories(tmp_path: Path) -> None:
    touch(
        tmp_path,
        "vis/vis-Q4_K_M.gguf",
        "vis/mmproj-vis-F16.gguf",
        "vis/x-mmproj-Q8_0.gguf",  # "contains mmproj": last seen wins
        "vis/mtp-vis.gguf",
        "vis/dflash-vis.gguf",  # first draft seen wins (sorted: dflash < mtp)
        "split/s-Q8_0-00002-of-00003.gguf",
        "split/s-Q8_0-00001-of-00003.gguf",
        "split/s-Q8_0-00003-of-00003.gguf",
        "onlyproj/mmproj.gguf",
        "empty/readme.md",
        "deep/inner/model.gguf",
    )
    found = scan_models_dir("./models/", tmp_path)
    assert found == {
        "vis": LocalModel(
            "vis",
            "./models/vis/vis-Q4_K_M.gguf",
            "./models/vis/x-mmproj-Q8_0.gguf",
            "./models/vis/dflash-vis.gguf",
        ),
        "split": LocalModel("split", "./models/split/s-Q8_0-00001-of-00003.gguf"),
    }


def test_symlinks_are_followed(tmp_path: Path) -> None:
    store = tmp_path / "store"
    touch(store, "real.gguf", "sub/inner.gguf")
    models = tmp_path / "models"
    models.mkdir()
    (models / "link.gguf").symlink_to(store / "real.gguf")
    (models / "linkdir").symlink_to(store / "sub")
    (models / "broken.gguf").symlink_to(store / "missing.gguf")
    found = scan_models_dir("/m", models)
    assert found == {
        "link": LocalModel("link", "/m/link.gguf"),
        "linkdir": LocalModel("linkdir", "/m/linkdir/inner.gguf"),
    }


def test_later_duplicate_name_replaces(tmp_path: Path) -> None:
    touch(tmp_path, "a/inner.gguf", "a.gguf")  # sorted: "a" < "a.gguf"
    assert scan_models_dir("d", tmp_path) == {"a": LocalModel("a", "d/a.gguf")}


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        scan_models_dir("nope", tmp_path / "nope")
    assert str(info.value) == "error: 'nope' does not exist or is not a directory"
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="does not exist or is not a directory"):
        scan_models_dir("file", tmp_path / "file")
