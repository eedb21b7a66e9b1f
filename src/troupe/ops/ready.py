"""The one line ``troupe serve`` logs once it serves: what it runs and how (for the journal)."""

from __future__ import annotations

from collections.abc import Sequence

from troupe.settings.router import RouterSettings

__all__ = ["ready_line"]

MAX_NAMES = 12  # models named in the line; the rest are counted


def ready_line(s: RouterSettings, names: Sequence[str], urls: Sequence[str]) -> str:
    shown = ", ".join(names[:MAX_NAMES]) + (
        f", +{len(names) - MAX_NAMES}" if len(names) > MAX_NAMES else ""
    )
    margin = "off" if s.memory_margin_bytes is None else f"{s.memory_margin_bytes >> 20} MiB"
    first = urls[0].rstrip("/") + s.api_prefix if urls else ""
    parts = [
        f"ready: {len(names)} model{'s' if len(names) > 1 else ''} ({shown})"
        if names
        else "ready: no models",
        f"models-max {s.models_max or 'unlimited'}",
        f"memory margin {margin}",
        f"queue-max {s.queue_max or 'unlimited'}",
        "api key required" if s.api_keys or s.tenants_file else "no api key",
        "listening on " + " ".join(urls),
        f"dashboard {first}/troupe/, metrics {first}/metrics",
    ]
    return "; ".join(parts)
