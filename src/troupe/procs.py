"""Running a short helper command (``--help``, ``--version``, ``ldd``) to completion."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

__all__ = ["run_captured"]


def run_captured(argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` with no stdin, capturing text output (undecodable bytes replaced).

    Raises OSError when it cannot start and subprocess.TimeoutExpired when it runs past
    ``timeout``; a non-zero exit is the caller's to judge.
    """
    return subprocess.run(
        list(argv),
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
    )
