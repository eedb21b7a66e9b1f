"""The catalog's result: immutable model entries and the `Catalog` that holds them."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs

from troupe.catalog import render
from troupe.catalog.preset import Preset
from troupe.catalog.values import byte_order
from troupe.settings.options import EngineOption

__all__ = [
    "DEFAULT_STOP_TIMEOUT",
    "Architecture",
    "ArchitectureProbe",
    "Catalog",
    "ModelEntry",
    "Source",
]

DEFAULT_STOP_TIMEOUT = 10  # seconds (server-models.cpp)


class Source(enum.StrEnum):
    """Where an entry came from; the last writer of the merge wins."""

    CACHE = "cache"
    MODELS_DIR = "models_dir"
    PRESET = "preset"


@attrs.frozen
class Architecture:
    """``architecture`` of ``GET /models``; text in, text out unless a probe knows better."""

    input_modalities: tuple[str, ...] = ("text",)
    output_modalities: tuple[str, ...] = ("text",)

    def to_json(self) -> dict[str, list[str]]:
        return {
            "input_modalities": list(self.input_modalities),
            "output_modalities": list(self.output_modalities),
        }


def _sorted(names: frozenset[str]) -> tuple[str, ...]:
    return tuple(sorted(names, key=byte_order))


@attrs.frozen
class ModelEntry:
    """One model the router can start."""

    name: str
    source: Source
    preset: Preset  # the merged preset, before update_args (render it with the Catalog)
    aliases: frozenset[str] = frozenset()
    tags: frozenset[str] = frozenset()
    hidden: bool = False  # left out of GET /models, still usable
    stop_timeout: int = DEFAULT_STOP_TIMEOUT
    load_on_startup: bool = False
    pin: bool = False  # troupe: never evicted for another model
    ttl: int | None = None  # troupe: idle seconds before unload; None: not set
    term_grace: float = 5.0  # troupe: seconds after SIGTERM before SIGKILL
    kv_store: bool = True  # troupe: its conversations may go to the KV store (--kv-store)
    model_path: Path | None = None  # local model file (first shard), absolute, if known offline
    mmproj_path: Path | None = None  # projector the router would probe; None if none or disabled
    architecture: Architecture = Architecture()

    @property
    def sorted_aliases(self) -> tuple[str, ...]:
        return _sorted(self.aliases)

    @property
    def sorted_tags(self) -> tuple[str, ...]:
        return _sorted(self.tags)

    @property
    def can_remove(self) -> bool:
        return self.source is Source.CACHE


# Fills `ModelEntry.architecture` (GGUF metadata, mmproj capabilities). A probe that
# raises leaves the default, as upstream's update_caps does on any failure.
ArchitectureProbe = Callable[[ModelEntry], Architecture]


@attrs.frozen
class Catalog:
    """Every model, in byte-wise name order, with lookups and rendering."""

    entries: tuple[ModelEntry, ...]
    cwd: Path  # relative paths in presets are relative to this: start children here
    warnings: tuple[str, ...] = ()  # what upstream logs as warnings while building
    forced: tuple[EngineOption, ...] = attrs.field(
        default=render.forced_options({}), repr=False
    )  # host, port, alias, log-colors as the engine spells them
    _by_name: dict[str, ModelEntry] = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {e.name: e for e in self.entries})

    def __iter__(self) -> Iterator[ModelEntry]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(e.name for e in self.entries)

    def get(self, name: str) -> ModelEntry | None:
        """The entry whose canonical name is ``name``."""
        return self._by_name.get(name)

    def resolve(self, name: str) -> ModelEntry | None:
        """By canonical name, then the first entry (name order) with ``name`` as alias."""
        found = self._by_name.get(name)
        if found is not None:
            return found
        return next((e for e in self.entries if name in e.aliases), None)

    def visible(self) -> tuple[ModelEntry, ...]:
        """The entries ``GET /models`` lists (hidden ones left out)."""
        return tuple(e for e in self.entries if not e.hidden)

    def startup_models(self) -> tuple[str, ...]:
        """Names with a truthy ``load-on-startup``, in name order."""
        return tuple(e.name for e in self.entries if e.load_on_startup)

    def child_args(
        self,
        entry: ModelEntry,
        port: int,
        *,
        bin_path: str,
        log_colors: bool = False,
        app_cmd: str = "",
    ) -> list[str]:
        """argv for ``entry``'s child on ``port`` (also ``status.args``; port 0 before
        the first spawn). ``app_cmd`` is ``$LLAMA_APP_CMD``."""
        return render.child_args(
            entry.preset,
            entry.name,
            port,
            bin_path=bin_path,
            log_colors=log_colors,
            app_cmd=app_cmd,
            forced=self.forced,
        )

    def child_env(self, entry: ModelEntry) -> dict[str, str]:
        """What ``entry``'s child gets in its environment beside its argv: its secrets
        (the hub token as ``HF_TOKEN``), which `child_args` never holds."""
        return render.secret_env(entry.preset)

    def status_preset(self, entry: ModelEntry, *, log_colors: bool = False) -> str:
        """``status.preset`` text for ``entry``."""
        return render.status_preset(
            entry.preset, entry.name, log_colors=log_colors, forced=self.forced
        )
