"""Exceptions that end a troupe command with one clear line.

Everything a user can cause (a bad flag, a missing file, no engine) raises a
`TroupeError`; the CLI prints its message on one line and exits non-zero.
Anything else escaping is a bug and keeps its traceback.
"""

from __future__ import annotations


class TroupeError(Exception):
    """A failure with a message meant for the user, not a traceback."""

    exit_code: int = 1


class UsageError(TroupeError):
    """Bad command-line input (unknown flag, missing value, bad number)."""

    exit_code = 2


class ConfigError(TroupeError):
    """A configuration file or preset that cannot be used."""


class EngineNotFound(TroupeError):
    """No usable llama-server binary."""
