"""The HF hub cache read offline (common/hf-cache.cpp, common/download.cpp)."""

from __future__ import annotations

from pathlib import Path

import pytest
from catalog_trees import COMMIT, OTHER_COMMIT, add_repo

from troupe.catalog import hfcache
from troupe.errors import ConfigError


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"LLAMA_CACHE": "/l", "HF_HUB_CACHE": "/h"}, "/l"),
        ({"LLAMA_CACHE": "", "HF_HUB_CACHE": "/h", "HUGGINGFACE_HUB_CACHE": "/u"}, "/h"),
        ({"HUGGINGFACE_HUB_CACHE": "/u", "HF_HOME": "/home"}, "/u"),
        ({"HF_HOME": "/hf", "XDG_CACHE_HOME": "/x"}, "/hf/hub"),
        ({"XDG_CACHE_HOME": "/x", "HOME": "/me"}, "/x/huggingface/hub"),
        ({"HOME": "/me"}, "/me/.cache/huggingface/hub"),
        ({"LLAMA_CACHE": "rel"}, "rel"),
    ],
)
def test_cache_dir_order(env: dict[str, str], expected: str) -> None:
    assert hfcache.cache_dir(env) == Path(expected)


def test_cache_dir_falls_back_to_passwd_home() -> None:
    assert hfcache.cache_dir({}).parts[-3:] == (".cache", "huggingface", "hub")


@pytest.mark.parametrize(
    ("repo", "valid"),
    [
        ("org/repo", True),
        ("org_1/my.model-GGUF", True),
        ("a/b", True),
        ("org/re/po", False),
        ("orgrepo", False),
        ("/repo", False),
        ("org/", False),
        ("org//repo", False),
        ("org/-repo", False),
        ("org/re..po", False),
        ("org/re po", False),
        ("org/répo", False),
        ("o/" + "r" * 254, True),
        ("o/" + "r" * 255, False),
        ("", False),
    ],
)
def test_repo_id_validation(repo: str, valid: bool) -> None:
    assert hfcache.is_valid_repo_id(repo) is valid


@pytest.mark.parametrize(
    ("path", "prefix", "tag", "index", "count"),
    [
        ("gemma-3-4b-it-Q4_K_M.gguf", "gemma-3-4b-it-Q4_K_M", "Q4_K_M", 1, 1),
        ("model.f16.gguf", "model.f16", "F16", 1, 1),
        ("x-UD-Q4_K_XL.gguf", "x-UD-Q4_K_XL", "Q4_K_XL", 1, 1),
        ("big-Q8_0-00002-of-00003.gguf", "big-Q8_0", "Q8_0", 2, 3),
        ("big-q8_0-00001-OF-00003.gguf", "big-q8_0", "Q8_0", 1, 3),
        ("tinyllamas/stories260K.gguf", "tinyllamas/stories260K", "", 1, 1),
        ("dir-Q4/model.gguf", "dir-Q4/model", "", 1, 1),
        ("model.bin", "", "", 0, 0),
        ("model.GGUF", "", "", 0, 0),
    ],
)
def test_split_info(path: str, prefix: str, tag: str, index: int, count: int) -> None:
    assert hfcache.split_info(path) == hfcache.SplitInfo(prefix, tag, index, count)


def test_cached_models_naming_and_filters(tmp_path: Path) -> None:
    add_repo(
        tmp_path,
        "org/repo",
        [
            "repo-Q4_K_M.gguf",
            "sub/repo-q4_k_m.gguf",  # same tag: one entry
            "repo.f16.gguf",
            "big-Q8_0-00001-of-00002.gguf",
            "big-Q8_0-00002-of-00002.gguf",
            "only-Q2_K-00002-of-00002.gguf",  # no first shard: nothing
            "mmproj-repo-F16.gguf",
            "mtp-repo-Q4_0.gguf",
            "eagle3-repo-Q5_0.gguf",
            "dflash-Q6_K.gguf",
            "dspark-Q3_K.gguf",
            "mmproj/inner-Q5_1.gguf",  # directories count: the prefix has "mmproj"
            "stories260K.gguf",  # no tag
            "README.md",
        ],
    )
    assert sorted(hfcache.cached_models(tmp_path)) == [
        "org/repo:F16",
        "org/repo:Q4_K_M",
        "org/repo:Q8_0",
    ]


def test_refs_prefer_main_else_first_valid(tmp_path: Path) -> None:
    add_repo(tmp_path, "o/main", ["m-Q4_0.gguf"], refs={"a": OTHER_COMMIT, "main": COMMIT})
    add_repo(tmp_path, "o/main", ["other-Q8_0.gguf"], commit=OTHER_COMMIT, refs={})
    add_repo(tmp_path, "o/nomain", ["n-Q5_0.gguf"], refs={"dev": COMMIT + "\n", "x": "junk"})
    add_repo(tmp_path, "o/badref", ["b-Q5_0.gguf"], refs={"main": COMMIT[:-1]})
    add_repo(tmp_path, "o/crlf", ["c-Q5_0.gguf"], refs={"main": COMMIT + "\r\n"})
    add_repo(tmp_path, "o/missing", ["d-Q5_0.gguf"], refs={"main": OTHER_COMMIT})
    assert sorted(hfcache.cached_models(tmp_path)) == ["o/main:Q4_0", "o/nomain:Q5_0"]


def test_folders_that_are_not_repos_are_ignored(tmp_path: Path) -> None:
    add_repo(tmp_path, "good/one", ["g-Q4_0.gguf"])
    snap = add_repo(tmp_path, "x/y", ["bad-Q4_0.gguf"])
    (tmp_path / "models--x--y").rename(tmp_path / "datasets--x--y")
    add_repo(tmp_path, "a/b/c", ["three-Q4_0.gguf"])  # models--a--b--c: two slashes
    add_repo(tmp_path, "a/-b", ["dash-Q4_0.gguf"])
    (tmp_path / "models--stray").write_text("not a directory")
    assert snap.parent.parent.name == "models--x--y"
    assert hfcache.cached_models(tmp_path) == ["good/one:Q4_0"]


def test_missing_cache_is_empty(tmp_path: Path) -> None:
    assert hfcache.cached_models(tmp_path / "absent") == []


def test_symlinks_are_files_and_link_directories_are_not_entered(tmp_path: Path) -> None:
    snap = add_repo(tmp_path, "o/r", ["real-Q4_0.gguf"])
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "hidden-Q8_0.gguf").write_bytes(b"")
    (snap / "linked").symlink_to(tmp_path / "elsewhere")
    (snap / "dangling-Q6_K.gguf").symlink_to(tmp_path / "no-such-blob")
    files = hfcache.cached_files(tmp_path, "o/r")
    assert [f.path for f in files] == ["dangling-Q6_K.gguf", "linked", "real-Q4_0.gguf"]
    assert files[2].local_path == snap / "real-Q4_0.gguf"
    assert files[2].local_path.is_symlink()
    assert sorted(hfcache.cached_models(tmp_path)) == ["o/r:Q4_0", "o/r:Q6_K"]


def test_resolve_path_by_tag_default_and_file(tmp_path: Path) -> None:
    snap = add_repo(
        tmp_path,
        "o/r",
        [
            "r-F16.gguf",
            "r-Q8_0.gguf",
            "s-Q4_K_M-00001-of-00002.gguf",
            "s-Q4_K_M-00002-of-00002.gguf",
        ],
    )
    assert hfcache.resolve_path(tmp_path, "o/r:f16") == snap / "r-F16.gguf"
    assert hfcache.resolve_path(tmp_path, "o/r") == snap / "s-Q4_K_M-00001-of-00002.gguf"
    assert hfcache.resolve_path(tmp_path, "o/r:Q5_0") is None
    assert hfcache.resolve_path(tmp_path, "o/r:X", "r-Q8_0.gguf") == snap / "r-Q8_0.gguf"
    assert hfcache.resolve_path(tmp_path, "o/r", "nope.gguf") is None
    assert hfcache.resolve_path(tmp_path, "o/absent:Q8_0") is None
    with pytest.raises(ConfigError, match=r"^error: invalid HF repo format"):
        hfcache.resolve_path(tmp_path, "justrepo:Q8_0")


def test_resolve_default_falls_back_to_first_model(tmp_path: Path) -> None:
    snap = add_repo(tmp_path, "o/r", ["mmproj-F16.gguf", "imatrix.gguf", "weights-BF16.gguf"])
    assert hfcache.resolve_path(tmp_path, "o/r") == snap / "weights-BF16.gguf"


def test_find_best_mmproj(tmp_path: Path) -> None:
    add_repo(
        tmp_path,
        "o/r",
        [
            "a/m-Q4_K_M.gguf",
            "mmproj-F16.gguf",
            "a/mmproj-F32.gguf",
            "a/mmproj-Q8_0.gguf",
            "b/mmproj-Q4_0.gguf",
        ],
    )
    files = hfcache.cached_files(tmp_path, "o/r")
    best = hfcache.find_best_mmproj(files, "a/m-Q4_K_M.gguf")
    assert best is not None
    assert best.path == "a/mmproj-Q8_0.gguf"  # deepest shared folder, closest bits (8 vs 4)
