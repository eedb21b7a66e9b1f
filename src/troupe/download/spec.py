"""`DownloadSpec`: everything one download job needs, as the router hands it to the
download actor (`troupe.actors.download`). Here, beside the parts it names, so the
router's downloads (`troupe.download.router`) build it without importing the actor."""

from __future__ import annotations

from pathlib import Path

import attrs

from troupe.download.journal import Journal
from troupe.download.plan import DownloadPlan
from troupe.download.transfer import DEFAULT_POLICY, RetryPolicy

__all__ = ["STALL_TIMEOUT", "DownloadSpec"]

STALL_TIMEOUT = 120.0  # no byte for this long, retries included: the job has failed


@attrs.frozen
class DownloadSpec:
    """Everything one job needs; ``plan`` is None when planning failed (``error`` says why)."""

    name: str
    job: int
    plan: DownloadPlan | None
    cache: Path
    endpoint: str
    token: str = ""
    journal: Journal | None = None
    error: str = ""
    error_status: int = 0
    stall_timeout: float = STALL_TIMEOUT
    policy: RetryPolicy = DEFAULT_POLICY
