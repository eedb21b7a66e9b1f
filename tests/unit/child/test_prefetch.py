"""Reading a model's files ahead: on the real kernel, the pages are in memory afterwards."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from troupe.child.prefetch import model_files, prefetch, readahead_chunk
from troupe_rig.pagecache import drop_pages, resident_fraction, wait_resident

MiB = 1 << 20


def cold_file(path: Path, size: int) -> Path:
    path.write_bytes(os.urandom(size))
    drop_pages(path)
    if resident_fraction(path) > 0.1:
        pytest.skip(f"{path.parent} keeps its pages in memory (tmpfs?)")
    return path


def test_a_cold_file_is_in_memory_after_the_read_ahead(tmp_path: Path) -> None:
    f = cold_file(tmp_path / "m.gguf", 48 * MiB)  # several chunks of any device
    assert prefetch([f]) == 48 * MiB
    assert wait_resident(f) == 1.0


def test_files_over_half_the_available_memory_are_left_alone(tmp_path: Path) -> None:
    f = cold_file(tmp_path / "m.gguf", 4 * MiB)
    assert prefetch([f], available=lambda: 6 * MiB) == 0
    assert resident_fraction(f) < 0.5


def test_missing_files_are_skipped_and_the_rest_read(tmp_path: Path) -> None:
    f = cold_file(tmp_path / "m.gguf", 2 * MiB)
    assert prefetch([tmp_path / "gone.gguf", f]) == 2 * MiB
    assert prefetch([tmp_path / "gone.gguf"]) == 0


def test_a_split_model_is_read_with_all_its_shards_and_its_projector(tmp_path: Path) -> None:
    first = tmp_path / "big-00001-of-00003.gguf"
    proj = tmp_path / "mmproj.gguf"
    assert model_files(first, proj) == [
        first,
        tmp_path / "big-00002-of-00003.gguf",
        tmp_path / "big-00003-of-00003.gguf",
        proj,
    ]
    assert model_files(tmp_path / "one.gguf") == [tmp_path / "one.gguf"]
    assert model_files(tmp_path / "big-00002-of-00003.gguf") == [
        tmp_path / "big-00002-of-00003.gguf"
    ]


def test_the_chunk_is_the_devices_read_ahead_or_128_kib(tmp_path: Path) -> None:
    assert readahead_chunk(os.makedev(0, 99)) == 128 << 10  # no block device: tmpfs and co
    assert readahead_chunk(tmp_path.stat().st_dev) >= 128 << 10
