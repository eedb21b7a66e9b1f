"""Value helpers with llama.cpp's exact semantics (``common_arg_utils``, ``std::stoi``).

Also the byte-wise ordering upstream gets from ``std::map<std::string, ...>``:
Python orders ``str`` by code point, which equals UTF-8 byte order except for
the lone surrogates ``os.fsdecode`` uses for undecodable file-name bytes, so
names are compared through their bytes.
"""

from __future__ import annotations

import re

from troupe.settings.flags import is_falsey, is_truthy

__all__ = [
    "ASCII_SPACE",
    "byte_order",
    "is_falsey",
    "is_truthy",
    "split_list",
    "stoi",
]

# C isspace() in the "C" locale (string_strip, std::stoi).
ASCII_SPACE = " \t\n\v\f\r"
_STOI = re.compile(r"[ \t\n\v\f\r]*([+-]?[0-9]+)")
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1


def stoi(value: str) -> int:
    """``std::stoi``: leading space, a sign, digits; the rest is ignored.

    Raises ValueError where stoi throws (no digits, or outside a 32-bit int).
    """
    m = _STOI.match(value)
    if m is None:
        raise ValueError(f"invalid integer: {value!r}")
    n = int(m.group(1))
    if not _INT_MIN <= n <= _INT_MAX:
        raise ValueError(f"integer out of range: {value!r}")
    return n


def split_list(value: str) -> frozenset[str]:
    """Aliases and tags: split on ``,``, strip C whitespace, drop empties."""
    return frozenset(s for part in value.split(",") if (s := part.strip(ASCII_SPACE)))


def byte_order(name: str) -> bytes:
    """Sort key giving ``std::string`` (strcmp) order."""
    return name.encode("utf-8", "surrogateescape")
