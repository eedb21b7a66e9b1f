"""A preset: a model's options, llama.cpp's ``common_preset``.

Upstream keys its option map by the option's *first* spelling (strcmp); that
order is the order of rendered arguments and of ``status.preset``. Here a
`Preset` keeps engine options sorted by `EngineOption.sort_name` and preset-only
keys (bare names, which sort after every dashed spelling) by name, so iterating
``options`` then ``extras`` is upstream's order. Presets are immutable; every
change returns a new one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from troupe.settings.options import EngineOption

__all__ = ["Preset"]


def _opts(items: Iterable[tuple[EngineOption, str]]) -> tuple[tuple[EngineOption, str], ...]:
    by_first: dict[str, tuple[EngineOption, str]] = {}
    for opt, value in items:
        prev = by_first.get(opt.sort_name)
        # the map keeps its first key object and takes the new value
        by_first[opt.sort_name] = (prev[0] if prev else opt, value)
    return tuple(v for _, v in sorted(by_first.items()))


def _extras(items: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(dict(items).items()))


@attrs.frozen
class Preset:
    """Named options: engine options (option, raw value) and preset-only key values."""

    name: str
    options: tuple[tuple[EngineOption, str], ...] = attrs.field(default=(), converter=_opts)
    extras: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_extras)

    # -- reading -------------------------------------------------------------

    def get(self, env: str) -> str | None:
        """The value of the option whose env name is ``env`` (``get_option``)."""
        for opt, value in self.options:
            if opt.env == env:
                return value
        return None

    def get_spelling(self, spelling: str) -> str | None:
        """The value of the option spelled ``spelling`` (any of its spellings)."""
        for opt, value in self.options:
            if spelling in opt.spellings or spelling in opt.negatives:
                return value
        return None

    def extra(self, key: str) -> str | None:
        """The raw value of preset-only key ``key``."""
        return dict(self.extras).get(key)

    def is_empty(self) -> bool:
        return not self.options and not self.extras

    def comparable(self) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
        """What upstream's ``std::map`` equality compares: first spelling and value."""
        return tuple((o.sort_name, v) for o, v in self.options), self.extras

    # -- changing ------------------------------------------------------------

    def renamed(self, name: str) -> Preset:
        return attrs.evolve(self, name=name)

    def with_option(self, opt: EngineOption, value: str) -> Preset:
        return attrs.evolve(self, options=(*self.options, (opt, value)))

    def with_extra(self, key: str, value: str) -> Preset:
        return attrs.evolve(self, extras=(*self.extras, (key, value)))

    def without_env(self, *envs: str) -> Preset:
        """``unset_option`` for each env name (options without an env stay)."""
        drop = set(envs)
        return attrs.evolve(
            self,
            options=tuple((o, v) for o, v in self.options if o.env is None or o.env not in drop),
        )

    def without_extras(self, keys: Iterable[str]) -> Preset:
        drop = set(keys)
        return attrs.evolve(self, extras=tuple((k, v) for k, v in self.extras if k not in drop))

    def set_env(self, env: str, value: str, fallback: EngineOption) -> Preset:
        """``set_option``: update the option with env ``env``, else add ``fallback``."""
        for opt, _ in self.options:
            if opt.env == env:
                return self.with_option(opt, value)
        return self.with_option(fallback, value)

    def merged(self, other: Preset) -> Preset:
        """``merge``: ``other``'s options overwrite this preset's; the name stays."""
        return attrs.evolve(
            self,
            options=(*self.options, *other.options),
            extras=(*self.extras, *other.extras),
        )

    @classmethod
    def build(
        cls,
        name: str,
        options: Iterable[tuple[EngineOption, str]] = (),
        extras: Mapping[str, str] | Iterable[tuple[str, str]] = (),
    ) -> Preset:
        items = extras.items() if isinstance(extras, Mapping) else extras
        return cls(name, tuple(options), tuple(items))
