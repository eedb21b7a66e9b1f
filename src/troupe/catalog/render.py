"""From a model's preset to a child's command line and to ``status.preset``.

``server_model_meta::update_args`` strips the reserved options, forces
``--host 127.0.0.1``, ``--port``, ``--alias <name>`` and ``--log-colors``, then
``common_preset::to_args`` renders: the last spelling of each option in
first-spelling order, ``--opt value`` for a valued option, a falsey flag as its
last negative spelling (or dropped), preset-only keys skipped.

Secrets never go on a command line (any local user reads it in ``ps``): an option in
`SECRET_OPTIONS` (the hub token) is left out of the argv and reaches the child in its
environment instead (`secret_env`: the variable the engine reads for it, ``(env:
HF_TOKEN)`` in its ``--help``), and ``status.preset`` shows it as `REDACTED`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import attrs

from troupe.catalog.ini import render_ini
from troupe.catalog.preset import Preset
from troupe.catalog.presetkeys import DEFAULT_PRESET_KEYS, PresetKeys
from troupe.catalog.values import is_falsey
from troupe.errors import ConfigError
from troupe.settings.options import EngineOption

__all__ = [
    "CHILD_HOST",
    "RESERVED_ENVS",
    "RESERVED_MODEL_ENVS",
    "child_args",
    "child_preset",
    "forced_options",
    "needs_restart",
    "preset_args",
    "restart_key",
    "secret_env",
    "status_preset",
    "without_secrets",
]

CHILD_HOST = "127.0.0.1"

# unset_reserved_args(preset, false)
RESERVED_ENVS = (
    "LLAMA_ARG_SSL_KEY_FILE",
    "LLAMA_ARG_SSL_CERT_FILE",
    "LLAMA_API_KEY",
    "LLAMA_ARG_API_KEY_FILE",
    "LLAMA_ARG_MODELS_DIR",
    "LLAMA_ARG_MODELS_MAX",
    "LLAMA_ARG_MODELS_PRESET",
    "LLAMA_ARG_MODELS_AUTOLOAD",
)
# unset_reserved_args(preset, true) adds these (the router's own command line only)
RESERVED_MODEL_ENVS = (
    "LLAMA_ARG_MODEL",
    "LLAMA_ARG_MMPROJ",
    "LLAMA_ARG_ALIAS",
    "LLAMA_ARG_HF_REPO",
)

_HOST = EngineOption(("--host",), hints=("HOST",), env="LLAMA_ARG_HOST")
_PORT = EngineOption(("--port",), hints=("PORT",), env="LLAMA_ARG_PORT")
_ALIAS = EngineOption(("-a", "--alias"), hints=("STRING",), env="LLAMA_ARG_ALIAS")
_LOG_COLORS = EngineOption(("--log-colors",), hints=("[on|off|auto]",), env="LLAMA_ARG_LOG_COLORS")
_FORCED = (_HOST, _PORT, _ALIAS, _LOG_COLORS)
_COMPARE_IGNORES = ("LLAMA_ARG_HOST", "LLAMA_ARG_PORT", "LLAMA_ARG_ALIAS", "LLAMA_ARG_LOG_COLORS")

# Options whose value is a secret -> the environment variable the engine reads it from.
SECRET_OPTIONS = {"--hf-token": "HF_TOKEN"}
REDACTED = "<redacted>"


def _secret_var(opt: EngineOption) -> str | None:
    for spelling, var in SECRET_OPTIONS.items():
        if spelling in opt.spellings or opt.env == var:
            return var
    return None


def secret_env(preset: Preset) -> dict[str, str]:
    """The secrets of ``preset``'s child as environment variables (its argv has none)."""
    out: dict[str, str] = {}
    for opt, value in preset.options:
        var = _secret_var(opt)
        if var is not None and value:
            out[var] = value
    return out


def without_secrets(preset: Preset, shown: str | None = None) -> Preset:
    """``preset`` without its secret options (or with each value ``shown`` instead)."""
    options = []
    for opt, value in preset.options:
        if _secret_var(opt) is None:
            options.append((opt, value))
        elif shown is not None:
            options.append((opt, shown))
    return attrs.evolve(preset, options=tuple(options))


def child_preset(
    preset: Preset,
    name: str,
    port: int,
    log_colors: bool,
    forced: Sequence[EngineOption] = _FORCED,
) -> Preset:
    """The preset ``update_args`` leaves behind (what a child is started with).

    ``forced`` supplies the host, port, alias and log-colors options to add when
    the preset lacks them; pass the engine table's own (see `forced_options`).
    """
    host, port_opt, alias, colors = forced
    p = preset.without_env(*RESERVED_ENVS)
    p = p.set_env("LLAMA_ARG_HOST", CHILD_HOST, host)
    p = p.set_env("LLAMA_ARG_PORT", str(port), port_opt)
    p = p.set_env("LLAMA_ARG_ALIAS", name, alias)
    return p.set_env("LLAMA_ARG_LOG_COLORS", "on" if log_colors else "off", colors)


def forced_options(by_env: dict[str, EngineOption]) -> tuple[EngineOption, ...]:
    """The four forced options as the engine's table spells them (fallbacks otherwise)."""
    return tuple(by_env.get(o.env or "", o) for o in _FORCED)


def preset_args(preset: Preset) -> list[str]:
    """``common_preset::to_args`` without the binary path."""
    args: list[str] = []
    for opt, value in preset.options:
        if len(opt.hints) > 1:
            raise ConfigError(
                f"common_preset::to_args(): option '{opt.long_name}' has two values, "
                "which is not supported yet"
            )
        if opt.takes_value:
            args += [opt.long_name, value]
        elif not is_falsey(value):
            args.append(opt.long_name)
        elif opt.negatives:
            args.append(opt.negatives[-1])
    return args


def child_args(
    preset: Preset,
    name: str,
    port: int,
    *,
    bin_path: str,
    log_colors: bool = False,
    app_cmd: str = "",
    forced: Sequence[EngineOption] = _FORCED,
) -> list[str]:
    """The child's argv (``status.args``): binary, optional ``LLAMA_APP_CMD``, options;
    never a secret (`secret_env` has them)."""
    args = preset_args(without_secrets(child_preset(preset, name, port, log_colors, forced)))
    head = [bin_path] if bin_path else []
    if app_cmd and bin_path:
        head.append(app_cmd)
    return head + args


def status_preset(
    preset: Preset,
    name: str,
    *,
    log_colors: bool = False,
    forced: Sequence[EngineOption] = _FORCED,
) -> str:
    """``status.preset`` of ``GET /models``: the child preset as INI, minus the reserved
    options, host, port, alias and tags (log-colors and preset-only keys stay); a secret's
    value shown as `REDACTED`."""
    p = without_secrets(child_preset(preset, name, 0, log_colors, forced), REDACTED)
    p = p.without_env(
        *RESERVED_ENVS, "LLAMA_ARG_HOST", "LLAMA_ARG_PORT", "LLAMA_ARG_ALIAS", "LLAMA_ARG_TAGS"
    )
    items = [(opt.key, value) for opt, value in p.options] + list(p.extras)
    return render_ini(name, items)


def restart_key(preset: Preset, keys: PresetKeys = DEFAULT_PRESET_KEYS) -> tuple[str, bool]:
    """What a reload compares to tell whether a running model restarts (``load_models``,
    reload branch): a digest of the preset as compared, and whether it restarts at every
    reload (the scheduler's `RestartKey`; `needs_restart` is the comparison).

    Upstream compares the running model's preset *after* ``update_args`` (reserved
    options stripped) with the fresh merged preset as is, both without host, port,
    alias and log-colors; so a reserved option written into a model's section
    restarts it at every reload, as upstream does. troupe's own preset-only keys
    (``upstream=False``) are left out of the comparison. A digest: the preset may hold
    secrets, which the scheduler has no business keeping.
    """
    own = [k.key for k in keys if not k.upstream]
    compared = preset.without_env(*RESERVED_ENVS, *_COMPARE_IGNORES).without_extras(own)
    digest = hashlib.sha256(repr(compared.comparable()).encode()).hexdigest()
    reserved = set(RESERVED_ENVS)
    return digest, any(o.env in reserved for o, _ in preset.options)


def needs_restart(
    running: Preset,
    fresh: Preset,
    keys: PresetKeys = DEFAULT_PRESET_KEYS,
) -> bool:
    """Whether a reload restarts a running model (see `restart_key`)."""
    old, _ = restart_key(running, keys)
    new, always = restart_key(fresh, keys)
    return always or old != new
