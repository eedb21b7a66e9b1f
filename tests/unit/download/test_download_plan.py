"""Which files a download fetches, from a repository listing (llama.cpp's choice)."""

from __future__ import annotations

import pytest

from troupe.download.plan import PlanError, RemoteFile, make_plan, parse_listing

SHA = "a" * 64
OID = "b" * 40


def listing(*paths: str) -> list[RemoteFile]:
    return [
        RemoteFile(p, 10 + i, f"{i:040x}", f"{i:064x}" if p.endswith(".gguf") else None)
        for i, p in enumerate(paths)
    ]


def plan(tag: str, *paths: str, mmproj: bool = True) -> list[tuple[str, str]]:
    name = f"o/r:{tag}" if tag else "o/r"
    p = make_plan(name, "o/r", tag, "main", "c" * 40, listing(*paths), mmproj=mmproj)
    return [(f.path, f.role) for f in p.files]


def test_the_tag_picks_the_file_case_insensitively() -> None:
    files = ("m-Q8_0.gguf", "m-Q4_K_M.gguf", "README.md")
    assert plan("q8_0", *files) == [("m-Q8_0.gguf", "model")]
    assert plan("Q4_K_M", *files) == [("m-Q4_K_M.gguf", "model")]


def test_no_tag_prefers_q4_k_m_then_q8_0_then_the_first_model() -> None:
    assert plan("", "m-F16.gguf", "m-Q8_0.gguf", "m-Q4_K_M.gguf") == [("m-Q4_K_M.gguf", "model")]
    assert plan("", "m-F16.gguf", "m-Q8_0.gguf") == [("m-Q8_0.gguf", "model")]
    assert plan("", "mmproj-m-F16.gguf", "m-F16.gguf") == [
        ("m-F16.gguf", "model"),
        ("mmproj-m-F16.gguf", "mmproj"),
    ]


def test_an_unknown_tag_fails_and_lists_what_there_is() -> None:
    with pytest.raises(PlanError, match=r"no GGUF file with tag 'Q2_K'.*m-Q8_0\.gguf"):
        plan("Q2_K", "m-Q8_0.gguf")
    with pytest.raises(PlanError, match="no GGUF model file"):
        plan("", "README.md", "mmproj-x-F16.gguf")


def test_split_models_take_every_shard_in_order_from_the_first() -> None:
    files = (
        "big-Q4_K_M-00002-of-00003.gguf",
        "big-Q4_K_M-00001-of-00003.gguf",
        "big-Q4_K_M-00003-of-00003.gguf",
        "big-Q8_0.gguf",
    )
    assert [p for p, _ in plan("Q4_K_M", *files)] == [
        "big-Q4_K_M-00001-of-00003.gguf",
        "big-Q4_K_M-00002-of-00003.gguf",
        "big-Q4_K_M-00003-of-00003.gguf",
    ]
    with pytest.raises(PlanError, match="only 2 of its 3 shards"):
        plan("Q4_K_M", *files[:2])


def test_the_closest_mmproj_comes_along_unless_refused() -> None:
    files = ("sub/m-Q4_K_M.gguf", "sub/mmproj-F16.gguf", "sub/mmproj-Q8_0.gguf", "mmproj-F32.gguf")
    assert plan("Q4_K_M", *files) == [
        ("sub/m-Q4_K_M.gguf", "model"),
        ("sub/mmproj-Q8_0.gguf", "mmproj"),
    ]
    assert plan("Q4_K_M", *files, mmproj=False) == [("sub/m-Q4_K_M.gguf", "model")]


def test_a_root_preset_ini_is_the_whole_plan() -> None:
    assert plan("", "preset.ini", "m-Q4_K_M.gguf") == [("preset.ini", "preset")]
    assert plan("", "sub/preset.ini", "m-Q4_K_M.gguf") == [("m-Q4_K_M.gguf", "model")]


def test_the_listed_name_carries_the_file_tag() -> None:
    p = make_plan("o/r", "o/r", "", "main", "c" * 40, listing("m-Q8_0.gguf"))
    assert p.listed_name == "o/r:Q8_0"
    assert p.total == 10


def test_parse_listing_keeps_sane_files_only() -> None:
    items = [
        {
            "type": "file",
            "path": "a-Q8_0.gguf",
            "size": 5,
            "oid": OID,
            "lfs": {"oid": SHA, "size": 7},
        },
        {"type": "file", "path": "README.md", "size": 3, "oid": OID},
        {"type": "directory", "path": "sub", "oid": OID},
        {"type": "file", "path": "../escape.gguf", "size": 1, "oid": OID},
        {"type": "file", "path": "/abs.gguf", "size": 1, "oid": OID},
        {"type": "file", "path": "x/./y.gguf", "size": 1, "oid": OID},
        {"type": "file", "path": "bad-oid.gguf", "size": 1, "oid": "zz"},
        {"type": "file", "path": "bad-lfs.gguf", "size": 1, "oid": OID, "lfs": {"oid": "short"}},
        {"type": "file", "path": "neg.gguf", "size": -1, "oid": OID},
        "junk",
    ]
    got = parse_listing(items)
    assert got == [RemoteFile("a-Q8_0.gguf", 7, OID, SHA), RemoteFile("README.md", 3, OID, None)]
    assert [f.oid for f in got] == [SHA, OID]
    assert parse_listing({"not": "a list"}) == []
