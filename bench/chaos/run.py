"""Chaos tests: faults injected into a real troupe (or llama.cpp's own router), invariants
checked after every scenario.

    .venv/bin/python bench/chaos/run.py [--quick] [--router troupe|llama-server|both]
                                        [SCENARIO ...]

One line per scenario (PASS/FAIL, what it measured, why it failed), then
``N passed, M failed``; the exit status is 1 when any scenario failed.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: _util, chaos

from chaos.runner import main

if __name__ == "__main__":
    sys.exit(main())
