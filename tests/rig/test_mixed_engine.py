"""The mixed launcher: the real engine, or the fake one when a --fake-* knob is given."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from troupe.settings.options import parse_help
from troupe_rig import write_mixed_engine
from troupe_rig.fake_engine import KNOBS

pytestmark = pytest.mark.engine


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)


def test_help_lists_the_real_options_and_the_knobs(engine_path: Path, tmp_path: Path) -> None:
    mixed = write_mixed_engine(tmp_path, engine_path)
    done = run(str(mixed), "--help")
    assert done.returncode == 0, done.stderr
    table = parse_help(done.stdout)
    real = parse_help(run(str(engine_path), "--help").stdout)
    spellings = {s for opt in table for s in opt.spellings}
    assert {s for opt in real for s in opt.spellings} <= spellings
    assert {o.args[0] for o in KNOBS} <= spellings


def test_a_knob_selects_the_fake(engine_path: Path, tmp_path: Path) -> None:
    mixed = write_mixed_engine(tmp_path, engine_path)
    real = run(str(mixed), "--version")
    fake = run(str(mixed), "--fake-oom", "--version")
    assert real.returncode == fake.returncode == 0
    assert "fake" not in real.stderr + real.stdout
    assert "version: 0.0.0-fake" in fake.stderr, fake.stderr
