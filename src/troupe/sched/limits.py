"""The core's fixed limits (``--models-max``, ``--queue-max``, fake timing)."""

from __future__ import annotations

import attrs

__all__ = ["FAKE_TIMING_DELAY", "Limits"]

FAKE_TIMING_DELAY = 2.0  # LLAMA_SERVER_DEBUG_FAKE_TIMING: seconds before each load


@attrs.frozen
class Limits:
    models_max: int  # 0: no limit
    queue_max: int = 0  # 0: no limit on waiting requests
    fake_timing: bool = False
