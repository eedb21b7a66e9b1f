"""llama.cpp's boolean option values (``common_arg_utils``): what reads as on, what as off.

Shared by the catalog (presets) and the hardware estimate, which both read option
values the way the engine will."""

from __future__ import annotations

__all__ = ["is_falsey", "is_truthy"]


def is_truthy(value: str) -> bool:
    """``common_arg_utils::is_truthy``: exactly on, enabled, true or 1 (case-sensitive)."""
    return value in ("on", "enabled", "true", "1")


def is_falsey(value: str) -> bool:
    """``common_arg_utils::is_falsey``: exactly off, disabled, false or 0."""
    return value in ("off", "disabled", "false", "0")
