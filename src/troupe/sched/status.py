"""Model statuses, spelled as llama.cpp's router spells them."""

from __future__ import annotations

import enum

__all__ = ["Status"]


class Status(enum.StrEnum):
    DOWNLOADING = "downloading"
    DOWNLOADED = "downloaded"
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    SLEEPING = "sleeping"

    @property
    def is_running(self) -> bool:
        """Holds a child that serves (or will serve) requests: counts against --models-max."""
        return self in (Status.LOADING, Status.LOADED, Status.SLEEPING)

    @property
    def is_ready_or_sleeping(self) -> bool:
        return self in (Status.LOADED, Status.SLEEPING)
