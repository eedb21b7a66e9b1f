"""Parsing a llama-server command line the way llama-server does.

``common_params_to_map`` in llama.cpp: ``--long_name`` may use underscores; a flag
becomes ``"1"`` (or ``"0"`` for its negative spelling); a valued option takes the
next word, even one starting with ``-`` (so ``--seed -1`` works); an unknown word is
an error; a later repeat wins. troupe's own flags (not llama-server's) are taken
out first by the caller.
"""

from __future__ import annotations

from collections.abc import Sequence

from troupe.errors import UsageError
from troupe.settings.options import EngineOption, OptionTable

__all__ = ["normalise_flag", "parse_engine_args"]


def normalise_flag(word: str) -> str:
    """llama.cpp accepts ``--ctx_size`` for ``--ctx-size``."""
    return word.replace("_", "-") if word.startswith("--") else word


def parse_engine_args(args: Sequence[str], table: OptionTable) -> dict[EngineOption, str]:
    """Parse ``args`` against ``table`` into option -> value, in first-seen order."""
    out: dict[EngineOption, str] = {}
    i = 0
    while i < len(args):
        word = args[i]
        found = table.by_spelling(normalise_flag(word))
        if found is None:
            if word.startswith("-"):
                raise UsageError(
                    f"unknown flag '{word}' (troupe serve --help lists troupe's flags)"
                )
            raise UsageError(
                f"unexpected argument '{word}': llama-server takes no positional argument"
            )
        opt, negated = found
        if len(opt.hints) > 1:
            raise UsageError(
                f"flag '{word}' takes {len(opt.hints)} values, which a router cannot forward"
            )
        if opt.takes_value:
            if i + 1 >= len(args):
                raise UsageError(f"flag '{word}' needs a value ({opt.hints[0]})")
            value = args[i + 1]
            i += 2
        else:
            value = "0" if negated else "1"
            i += 1
        out[opt] = value
    return out
