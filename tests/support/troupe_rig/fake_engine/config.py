"""What one fake engine process is told to be: llama-server settings plus knobs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import attrs

from troupe_rig.fake_engine.options import OPTIONS, TRUTHY, Opt, knob, parse_args

__all__ = ["ALL_OPTIONS", "KNOBS", "FakeConfig", "load_config"]

KNOBS: tuple[Opt, ...] = (
    knob("load-time", "seconds the fake takes to load its model, reporting loading progress "
         "(default: 0)", "SECONDS"),
    knob("load-gate", "keep loading until this file exists, so a test decides when loading ends "
         "(default: none)", "PATH"),
    knob("load-crash", "exit with this code halfway through loading, before ready (default: -1 "
         "= load normally)", "CODE"),
    knob("oom", "print a CUDA out-of-memory failure on stderr while loading, then exit 1"),
    knob("crash-after", "die after generating N tokens of a response, streamed or not "
         "(default: -1 = never)", "N"),
    knob("crash-code", "exit code used by --fake-crash-after (default: 1)", "CODE"),
    knob("ignore-exit", "ignore the router's exit command on stdin"),
    knob("ignore-sigterm", "ignore SIGTERM (SIGKILL still works)"),
    knob("tps", "tokens generated per second (default: 0 = as fast as possible)", "N"),
    knob("tokens", "tokens generated when a request sets no n_predict/max_tokens (default: 16)",
         "N"),
    knob("sleep-idle", "seconds of idleness before sleeping; overrides --sleep-idle-seconds "
         "and may be fractional (default: -1 = never)", "SECONDS"),
    knob("shutdown-time", "seconds a graceful shutdown takes (default: 0)", "SECONDS"),
    knob("audio", "take audio input: report the audio modality, answer "
         "/v1/audio/transcriptions with the length and rate of the WAV heard"),
)  # fmt: skip

ALL_OPTIONS: tuple[Opt, ...] = OPTIONS + KNOBS


def _split(value: str) -> tuple[str, ...]:
    return tuple(sorted({p.strip() for p in value.split(",") if p.strip()}))


@attrs.frozen
class FakeConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    model: str | None = None
    mmproj: str | None = None
    aliases: tuple[str, ...] = ()  # sorted, like llama.cpp's std::set
    tags: tuple[str, ...] = ()
    ctx_size: int = 0
    parallel: int = -1
    n_predict: int = -1
    api_prefix: str = ""
    api_keys: tuple[str, ...] = ()
    sleep_idle: float = -1.0
    log_colors: bool = False
    # knobs
    load_time: float = 0.0
    load_gate: str | None = None
    load_crash: int = -1
    oom: bool = False
    crash_after: int = -1
    crash_code: int = 1
    ignore_exit: bool = False
    ignore_sigterm: bool = False
    tps: float = 0.0
    tokens: int = 16
    shutdown_time: float = 0.0
    audio: bool = False
    # what the command line asked for besides serving
    show_help: bool = False
    show_version: bool = False
    ignored: tuple[str, ...] = ()

    @property
    def model_name(self) -> str:
        """llama.cpp: the first alias (std::set order), else the model path as given."""
        if self.aliases:
            return self.aliases[0]
        return self.model or "fake-model"

    @property
    def n_ctx(self) -> int:
        return self.ctx_size if self.ctx_size > 0 else 4096

    @property
    def n_slots(self) -> int:
        return self.parallel if self.parallel > 0 else 4  # llama-server resolves auto to 4


def load_config(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> FakeConfig:
    """Parse ``argv`` (without the program name); bad numbers fall back to defaults."""
    parsed = parse_args(argv, ALL_OPTIONS, environ)
    v = parsed.values

    def num(key: str, default: float) -> float:
        try:
            return float(v[key])
        except (KeyError, ValueError):
            return default

    def integer(key: str, default: int) -> int:
        return int(num(key, default))

    def flag(key: str) -> bool:
        return v.get(key, "0").strip().lower() in TRUTHY

    sleep_idle = num("fake_sleep_idle", num("sleep_idle_seconds", -1.0))
    return FakeConfig(
        host=v.get("host", "127.0.0.1").split(",")[0].strip(),
        port=integer("port", 8080),
        model=v.get("model") or v.get("hf_repo") or None,
        mmproj=v.get("mmproj") or None,
        aliases=_split(v.get("alias", "")),
        tags=_split(v.get("tags", "")),
        ctx_size=integer("ctx_size", 0),
        parallel=integer("parallel", -1),
        n_predict=integer("n_predict", -1),
        api_prefix=v.get("api_prefix", "").rstrip("/"),
        api_keys=tuple(k for k in v.get("api_key", "").split(",") if k),
        sleep_idle=sleep_idle if sleep_idle > 0 else -1.0,
        log_colors=v.get("log_colors", "off").strip().lower() in TRUTHY,
        load_time=max(0.0, num("fake_load_time", 0.0)),
        load_gate=v.get("fake_load_gate") or None,
        load_crash=integer("fake_load_crash", -1),
        oom=flag("fake_oom"),
        audio=flag("fake_audio"),
        crash_after=integer("fake_crash_after", -1),
        crash_code=integer("fake_crash_code", 1),
        ignore_exit=flag("fake_ignore_exit"),
        ignore_sigterm=flag("fake_ignore_sigterm"),
        tps=max(0.0, num("fake_tps", 0.0)),
        tokens=max(0, integer("fake_tokens", 16)),
        shutdown_time=max(0.0, num("fake_shutdown_time", 0.0)),
        show_help=flag("help"),
        show_version=flag("version"),
        ignored=parsed.ignored,
    )
