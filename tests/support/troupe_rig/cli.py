"""The ``troupe`` command as a user runs it: a subprocess, and the shape every mistake
at its door must have (one ``troupe: error:`` line on stderr, a non-zero exit, never a
traceback)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["assert_one_line_error", "run_troupe"]


def run_troupe(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "troupe", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
        cwd=cwd,
        check=False,
    )


def assert_one_line_error(done: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("troupe: error:")]
    assert len(lines) == 1, done.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
