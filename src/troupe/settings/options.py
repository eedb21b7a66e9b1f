"""The engine's own option table, learned from ``llama-server --help``.

troupe forwards every llama-server flag it does not handle itself, validates
preset keys, and renders child command lines. All three need to know the
engine's options: their spellings, which ones take a value, and their
``LLAMA_ARG_*`` environment names. Rather than keep a hand-written copy that
drifts from the engine, troupe parses the help text of the very binary it runs,
once per binary (cached on disk, keyed by path, size and mtime).

The help format (llama.cpp ``common_arg::to_string``): one entry per option,
starting at column 0 with its comma-separated spellings, then the value hints;
the help text starts at column 40 (or on the next line when the spellings are
long) and ends with ``(env: NAME)`` when the option has an environment name.
Negative spellings (``--no-mmap``) follow the positive ones.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
from collections.abc import Iterable, Iterator
from pathlib import Path

import attrs

from troupe.errors import EngineNotFound
from troupe.procs import run_captured

__all__ = ["EngineOption", "OptionTable", "load_option_table", "parse_help"]

_HELP_COLUMN = 40
_SPELLING = re.compile(r"(-{1,2}[A-Za-z0-9][A-Za-z0-9_.-]*)(,\s*|\s+|$)")
_ENV = re.compile(r"\(env: ([A-Z0-9_]+)\)")
_CACHE_FORMAT = 1


@attrs.frozen
class EngineOption:
    """One llama-server option, as its ``--help`` describes it."""

    spellings: tuple[str, ...]  # positive spellings, in help order ("-c", "--ctx-size")
    negatives: tuple[str, ...] = ()  # "--no-mmap" for a boolean that has one
    hints: tuple[str, ...] = ()  # value hints; empty for a flag
    env: str | None = None

    @property
    def takes_value(self) -> bool:
        return bool(self.hints)

    @property
    def key(self) -> str:
        """Canonical key: the last spelling without dashes (what upstream renders)."""
        return self.spellings[-1].lstrip("-")

    @property
    def long_name(self) -> str:
        """The spelling used to render the option on a command line."""
        return self.spellings[-1]

    @property
    def sort_name(self) -> str:
        """Upstream orders rendered options by the first spelling (strcmp)."""
        return self.spellings[0]

    def env_names(self) -> tuple[str, ...]:
        if self.env is None:
            return ()
        if self.negatives:
            return (self.env, self.env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_", 1))
        return (self.env,)


@attrs.frozen
class OptionTable:
    """All options of one engine binary, with lookups by spelling, key and env name."""

    options: tuple[EngineOption, ...]
    _by_spelling: dict[str, tuple[EngineOption, bool]] = attrs.field(
        init=False, repr=False, eq=False
    )
    _by_env: dict[str, tuple[EngineOption, bool]] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        by_spelling: dict[str, tuple[EngineOption, bool]] = {}
        by_env: dict[str, tuple[EngineOption, bool]] = {}
        for opt in self.options:
            for s in opt.spellings:
                by_spelling.setdefault(s, (opt, False))
            for s in opt.negatives:
                by_spelling.setdefault(s, (opt, True))
            names = opt.env_names()
            for i, name in enumerate(names):
                by_env.setdefault(name, (opt, i == 1))
        object.__setattr__(self, "_by_spelling", by_spelling)
        object.__setattr__(self, "_by_env", by_env)

    def __iter__(self) -> Iterator[EngineOption]:
        return iter(self.options)

    def __len__(self) -> int:
        return len(self.options)

    def by_spelling(self, spelling: str) -> tuple[EngineOption, bool] | None:
        """``("--no-mmap")`` -> ``(mmap option, negated=True)``; None if unknown."""
        return self._by_spelling.get(spelling)

    def by_key(self, key: str) -> tuple[EngineOption, bool] | None:
        """A preset key: a spelling without dashes (long or short, or negated), or an env name."""
        found = self._by_env.get(key)
        if found is not None:
            return found
        for dashes in ("--", "-"):
            found = self._by_spelling.get(dashes + key)
            if found is not None:
                return found
        return None

    def by_env(self, name: str) -> tuple[EngineOption, bool] | None:
        return self._by_env.get(name)

    def to_json(self) -> list[dict[str, object]]:
        return [attrs.asdict(o) for o in self.options]

    @classmethod
    def from_json(cls, data: Iterable[dict[str, object]]) -> OptionTable:
        opts = []
        for d in data:
            opts.append(
                EngineOption(
                    spellings=tuple(d["spellings"]),  # type: ignore[arg-type]
                    negatives=tuple(d["negatives"]),  # type: ignore[arg-type]
                    hints=tuple(d["hints"]),  # type: ignore[arg-type]
                    env=d["env"],  # type: ignore[arg-type]
                )
            )
        return cls(tuple(opts))


def _split_negatives(spellings: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    # Negatives follow the positives: they start at the first later spelling that is
    # "--no-..." or a short "-n..." form directly followed by one ("-nkvo, --no-kv-offload").
    for i in range(1, len(spellings)):
        s = spellings[i]
        nxt = spellings[i + 1] if i + 1 < len(spellings) else ""
        if s.startswith("--no-") or (
            not s.startswith("--") and s.startswith("-n") and nxt.startswith("--no-")
        ):
            return tuple(spellings[:i]), tuple(spellings[i:])
    return tuple(spellings), ()


def _split_hints(text: str) -> tuple[str, ...]:
    # "START END" is two values; "<tensor name pattern>=<buffer type>,..." is one:
    # a blank inside <...> does not separate hints.
    hints: list[str] = []
    word, depth = "", 0
    for c in text.strip():
        depth += (c == "<") - (c == ">" and depth > 0)
        if c.isspace() and depth == 0:
            if word:
                hints.append(word)
            word = ""
        else:
            word += c
    if word:
        hints.append(word)
    return tuple(hints)


def _parse_entry(lines: list[str]) -> EngineOption | None:
    first = lines[0]
    if len(first) > _HELP_COLUMN and first[:_HELP_COLUMN].endswith("   "):
        head = first[:_HELP_COLUMN].rstrip()
    else:
        head = first.strip()
    spellings: list[str] = []
    pos = 0
    while pos < len(head):
        m = _SPELLING.match(head, pos)
        if m is None:
            break
        spellings.append(m.group(1))
        pos = m.end()
        if not m.group(2).startswith(","):
            break
    if not spellings:
        return None
    hints = _split_hints(head[pos:])
    env_match = _ENV.search(" ".join(line.strip() for line in lines))
    env = env_match.group(1) if env_match else None
    positives: tuple[str, ...] = tuple(spellings)
    negatives: tuple[str, ...] = ()
    if not hints:
        positives, negatives = _split_negatives(spellings)
    return EngineOption(spellings=positives, negatives=negatives, hints=hints, env=env)


def parse_help(text: str) -> OptionTable:
    """Parse llama-server ``--help`` output into an `OptionTable`."""
    options: list[EngineOption] = []
    entry: list[str] = []

    def flush() -> None:
        if entry:
            opt = _parse_entry(entry)
            if opt is not None:
                options.append(opt)
            entry.clear()

    for raw in text.splitlines():
        line = raw.rstrip("\n")
        if line.startswith("-----"):
            flush()
        elif line.startswith("-"):
            flush()
            entry.append(line)
        elif entry and line.startswith(" "):
            entry.append(line)
        else:
            flush()
    flush()
    return OptionTable(tuple(options))


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "troupe" / "engine-options"


def _cache_key(engine: Path) -> str:
    st = engine.stat()
    raw = f"{_CACHE_FORMAT}:{engine.resolve()}:{st.st_size}:{st.st_mtime_ns}"
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


def load_option_table(
    engine: Path, *, use_cache: bool = True, timeout: float = 30.0
) -> OptionTable:
    """The option table of ``engine``, from the disk cache or by running ``--help``."""
    cache_file = _cache_dir() / f"{_cache_key(engine)}.json"
    if use_cache:
        try:
            return OptionTable.from_json(json.loads(cache_file.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            pass
    try:
        done = run_captured([str(engine), "--help"], timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EngineNotFound(f"engine '{engine}' cannot describe its options: {exc}") from None
    table = parse_help(done.stdout)
    if len(table) == 0:
        raise EngineNotFound(
            f"engine '{engine}' printed no options for --help (exit code {done.returncode})"
        )
    if use_cache:
        try:
            cache_file.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache_file.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps(table.to_json()))
            tmp.replace(cache_file)
        except OSError:
            pass  # a read-only home only costs a --help run per start
    return table
