"""Ollama's ``keep_alive``: a number of seconds or a Go duration ("5m", "1h30m", "-1").

Negative is "keep it loaded" (inf here), 0 is "unload once done". Ollama reads a bare
number as seconds, a string as a Go duration (a bare number in a string is seconds
too, as Ollama accepts it).
"""

from __future__ import annotations

import math
import re

__all__ = ["BadKeepAlive", "parse_keep_alive"]

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


class BadKeepAlive(ValueError):
    pass


def _seconds(value: float) -> float:
    return math.inf if value < 0 else value


def parse_keep_alive(value: object) -> float | None:
    """Idle seconds (inf: forever) for ``value``; None when not given. Raises `BadKeepAlive`."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise BadKeepAlive(f"invalid keep_alive {value!r}")
    if isinstance(value, int | float):
        if math.isnan(value):
            raise BadKeepAlive("invalid keep_alive NaN")
        return _seconds(float(value))
    if not isinstance(value, str):
        raise BadKeepAlive(f"invalid keep_alive {value!r}")
    text = value.strip()
    try:
        return _seconds(float(text))
    except ValueError:
        pass
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    if not body:
        raise BadKeepAlive(f'time: invalid duration "{value}"')
    total, pos = 0.0, 0
    for match in _PART.finditer(body):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(body):
        raise BadKeepAlive(f'time: invalid duration "{value}"')
    return _seconds(sign * total)
