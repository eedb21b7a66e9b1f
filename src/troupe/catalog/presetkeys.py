"""Preset-only keys: INI keys that configure the router, never a child's command line.

llama.cpp registers three (``common_params_add_preset_options``): ``load-on-startup``,
``stop-timeout`` and ``dedup-cache-models``, each with a pseudo environment name
``__PRESET_*`` that is also accepted as the key. troupe adds its own (``pin``,
``ttl``, ``term-grace``, ``kv-store``) the same way: one `PresetOnlyKey` in
`DEFAULT_PRESET_KEYS`. A key's raw value is kept in the preset (and shown in
``status.preset``); ``parse`` turns it into the typed value a `ModelEntry` carries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import attrs

from troupe.catalog.values import is_falsey, is_truthy

__all__ = [
    "DEDUP_CACHE_MODELS",
    "DEFAULT_PRESET_KEYS",
    "KV_STORE",
    "LOAD_ON_STARTUP",
    "PIN",
    "STOP_TIMEOUT",
    "TERM_GRACE",
    "TTL",
    "PresetKeys",
    "PresetOnlyKey",
]


def _parse_raw(value: str) -> object:
    return value


def _parse_truthy(value: str) -> object:
    return is_truthy(value)


def _parse_on_off(value: str) -> object:
    if is_truthy(value):
        return True
    if is_falsey(value):
        return False
    raise ValueError("expected on or off")


def _parse_seconds(value: str) -> object:
    try:
        seconds = float(value.strip())
    except ValueError:
        raise ValueError("expected a number of seconds >= 0") from None
    if not seconds >= 0:
        raise ValueError("expected a number of seconds >= 0")
    return seconds


def _parse_ttl(value: str) -> object:
    text = value.strip()
    if not text.isascii() or not text.isdigit():
        raise ValueError("expected a whole number of seconds >= 0")
    return int(text)


@attrs.frozen
class PresetOnlyKey:
    """One preset-only key. ``parse`` raises ValueError for a value it rejects."""

    key: str  # the INI key, also what status.preset shows ("stop-timeout")
    env: str  # the pseudo env name, also accepted as a key ("__PRESET_STOP_TIMEOUT")
    hint: str
    help: str
    parse: Callable[[str], object] = _parse_raw
    # Known to llama-server. A reload compares whole presets, so a change of an
    # upstream key restarts a running model as upstream does; troupe's own keys
    # (router-side only) leave running models alone.
    upstream: bool = True


LOAD_ON_STARTUP = PresetOnlyKey(
    "load-on-startup",
    "__PRESET_LOAD_ON_STARTUP",
    "NAME",
    "in server router mode, autoload this model on startup",
    _parse_truthy,
)
# Upstream parses stop-timeout with std::stoi and falls back to 10 with a warning;
# the catalog does that itself (it needs the model name for the warning).
STOP_TIMEOUT = PresetOnlyKey(
    "stop-timeout",
    "__PRESET_STOP_TIMEOUT",
    "SECONDS",
    "in server router mode, force-kill model instance after this many seconds of graceful shutdown",
)
DEDUP_CACHE_MODELS = PresetOnlyKey(
    "dedup-cache-models",
    "__PRESET_DEDUP_CACHE_MODELS",
    "0|1",
    "in server router mode, hide a cached model from the model list when this preset "
    "resolves to the same model file",
    _parse_truthy,
)
PIN = PresetOnlyKey(
    "pin",
    "__TROUPE_PIN",
    "0|1",
    "troupe: never evict this model to make room for another",
    _parse_truthy,
    upstream=False,
)
TTL = PresetOnlyKey(
    "ttl",
    "__TROUPE_TTL",
    "SECONDS",
    "troupe: unload this model after this many idle seconds (0: never)",
    _parse_ttl,
    upstream=False,
)

TERM_GRACE = PresetOnlyKey(
    "term-grace",
    "__TROUPE_TERM_GRACE",
    "SECONDS",
    "troupe: seconds a child gets after SIGTERM (sent once stop-timeout has passed) "
    "before SIGKILL (default: 5)",
    _parse_seconds,
    upstream=False,
)

KV_STORE = PresetOnlyKey(
    "kv-store",
    "__TROUPE_KV_STORE",
    "on|off",
    "troupe: off keeps this model out of the KV store (no slot files, saves or restores: "
    "llama.cpp's behaviour), as --kv-store off does for every model",
    _parse_on_off,
    upstream=False,
)


@attrs.frozen
class PresetKeys:
    """A registry of preset-only keys, looked up by key or by pseudo env name."""

    keys: tuple[PresetOnlyKey, ...]
    _by_name: dict[str, PresetOnlyKey] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        by_name: dict[str, PresetOnlyKey] = {}
        for k in self.keys:
            if not k.key or k.key.startswith("-"):
                # rendering puts preset-only keys after every dashed option (strcmp order)
                raise ValueError(f"bad preset-only key {k.key!r}")
            by_name[k.key] = k
            by_name[k.env] = k
        object.__setattr__(self, "_by_name", by_name)

    def __iter__(self) -> Iterator[PresetOnlyKey]:
        return iter(self.keys)

    def lookup(self, name: str) -> PresetOnlyKey | None:
        """The key named ``name`` (INI key or pseudo env name), or None."""
        return self._by_name.get(name)

    def get(self, key: str) -> PresetOnlyKey:
        return self._by_name[key]

    def with_key(self, key: PresetOnlyKey) -> PresetKeys:
        """A registry with ``key`` added (or replacing the key of the same name)."""
        return PresetKeys((*(k for k in self.keys if k.key != key.key), key))


DEFAULT_PRESET_KEYS = PresetKeys(
    (LOAD_ON_STARTUP, STOP_TIMEOUT, DEDUP_CACHE_MODELS, PIN, TTL, TERM_GRACE, KV_STORE),
)
