"""Parsing a llama-server command line the way llama-server does.

``common_params_to_map`` in llama.cpp: ``--long_name`` may use underscores; a flag
becomes ``"1"`` (or ``"0"`` for its negative spelling); a valued option takes the
next word, even one starting with ``-`` (so ``--seed -1`` works); an unknown word is
an error; a later repeat wins. troupe's own flags (not llama-server's) are taken
out first by the caller.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence

from troupe.errors import UsageError
from troupe.settings.options import EngineOption, OptionTable
from troupe.settings.table import SETTINGS

__all__ = ["did_you_mean", "normalise_flag", "parse_engine_args"]


def normalise_flag(word: str) -> str:
    """llama.cpp accepts ``--ctx_size`` for ``--ctx-size``."""
    return word.replace("_", "-") if word.startswith("--") else word


def did_you_mean(word: str, table: OptionTable) -> str:
    """`` (did you mean --models-max?)`` for a misspelt long flag, else ``""``: the
    closest of the engine's and troupe's own spellings."""
    if not word.startswith("--"):
        return ""
    known = {s for o in table for s in (*o.spellings, *o.negatives) if s.startswith("--")}
    known |= {s for st in SETTINGS for s in (*st.spellings, *st.negatives)}
    close = difflib.get_close_matches(normalise_flag(word).split("=", 1)[0], known, n=1, cutoff=0.8)
    return f" (did you mean {close[0]}?)" if close else ""


def parse_engine_args(args: Sequence[str], table: OptionTable) -> dict[EngineOption, str]:
    """Parse ``args`` against ``table`` into option -> value, in first-seen order."""
    out: dict[EngineOption, str] = {}
    i = 0
    while i < len(args):
        word = args[i]
        found = table.by_spelling(normalise_flag(word))
        if found is None:
            if word.startswith("-"):
                hint = did_you_mean(word, table) or " (troupe serve --help lists troupe's flags)"
                raise UsageError(f"unknown flag '{word}'{hint}")
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
