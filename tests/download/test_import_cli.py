"""``troupe import``: a local GGUF into --models-dir, validated (a real process each)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf
import pytest

from troupe.catalog.modelsdir import scan_models_dir
from troupe_rig import TinyModel, write_tiny_gguf


def troupe_import(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "troupe", "import", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def one_line_error(done: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if ln.startswith("troupe: error:")]
    assert fragment in line, line


def write_clip(path: Path) -> Path:
    writer = gguf.GGUFWriter(str(path), "clip")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    d = tmp_path / "models"
    d.mkdir()
    return d


@pytest.fixture
def model(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    return write_tiny_gguf(src / "My-Model-Q8_0.gguf", TinyModel(name="imp"))


def test_a_model_is_copied_where_the_models_dir_scan_finds_it(
    model: Path, models_dir: Path
) -> None:
    done = troupe_import(str(model), "--models-dir", str(models_dir))
    assert done.returncode == 0, done.stderr
    target = models_dir / "My-Model-Q8_0.gguf"
    assert target.read_bytes() == model.read_bytes()
    assert not target.is_symlink()
    assert list(scan_models_dir(str(models_dir), models_dir)) == ["My-Model-Q8_0"]
    assert "imported My-Model-Q8_0" in done.stdout
    again = troupe_import(str(model), "--models-dir", str(models_dir))
    one_line_error(again, "already exists")


def test_link_and_an_mmproj_beside_it_make_one_folder(model: Path, models_dir: Path) -> None:
    write_clip(model.parent / "mmproj-My-Model-F16.gguf")
    done = troupe_import(str(model), "--models-dir", str(models_dir), "--link", "--name", "mine")
    assert done.returncode == 0, done.stderr
    folder = models_dir / "mine"
    assert (folder / model.name).resolve() == model.resolve()
    assert (folder / "mmproj-My-Model-F16.gguf").is_symlink()
    (found,) = scan_models_dir(str(models_dir), models_dir).values()
    assert (found.name, Path(found.path).name) == ("mine", model.name)
    assert Path(found.mmproj).name == "mmproj-My-Model-F16.gguf"


def test_not_a_gguf_is_refused(tmp_path: Path, models_dir: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + b"\0" * 100)
    one_line_error(troupe_import(str(bad), "--models-dir", str(models_dir)), "no GGUF magic")
    assert list(models_dir.iterdir()) == []


def test_a_truncated_gguf_is_refused(model: Path, tmp_path: Path, models_dir: Path) -> None:
    cut = tmp_path / "cut-Q8_0.gguf"
    cut.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    done = troupe_import(str(cut), "--models-dir", str(models_dir))
    one_line_error(done, "cut-Q8_0.gguf")
    assert list(models_dir.iterdir()) == []


def test_a_lone_mmproj_is_refused(tmp_path: Path, models_dir: Path) -> None:
    clip = write_clip(tmp_path / "mmproj-x-F16.gguf")
    done = troupe_import(str(clip), "--models-dir", str(models_dir))
    one_line_error(done, "CLIP multimodal projector")
    assert list(models_dir.iterdir()) == []


@pytest.mark.parametrize("name", ["../evil", "..", ".hidden", "a/b", "x y", "my-mmproj"])
def test_names_that_could_escape_or_hide_are_refused(
    model: Path, models_dir: Path, name: str
) -> None:
    done = troupe_import(str(model), "--models-dir", str(models_dir), "--name", name)
    one_line_error(done, f"invalid model name '{name}'")
    assert list(models_dir.iterdir()) == []
    assert not (models_dir.parent / "evil.gguf").exists()


def test_usage_errors(model: Path, tmp_path: Path) -> None:
    one_line_error(troupe_import(), "usage: troupe import")
    one_line_error(troupe_import(str(model)), "give --models-dir")
    one_line_error(
        troupe_import(str(model), "--models-dir", str(tmp_path / "nope")), "does not exist"
    )
    one_line_error(
        troupe_import(str(tmp_path / "missing.gguf"), "--models-dir", str(tmp_path)), "no such file"
    )
