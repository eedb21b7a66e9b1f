"""The cluster's failure test checks bench/chaos's invariants with the harness's own
checkers: bench/ (runnable alone) is put on the import path, as tests/bench does."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))
