"""The fake engine's command line: a subset of llama-server's options plus knobs.

``--help`` is rendered exactly like llama.cpp's ``common_arg::to_string`` so that
troupe's help parser (`troupe.settings.options.parse_help`) learns the fake's
options the same way it learns the real engine's, knobs included; a knob is then
usable as a preset key (``fake-load-time = 2``).

Parsing is lenient on purpose: troupe renders many llama-server flags the fake
does not model, so an unknown ``--flag`` is skipped, together with the next word
when that word does not start with ``-`` (taken to be the flag's value).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import attrs

__all__ = ["OPTIONS", "Opt", "ParsedArgs", "parse_args", "render_help"]

_HELP_COLUMN = 40
_HELP_WIDTH = 70
TRUTHY = frozenset({"1", "true", "on", "enabled", "yes"})


@attrs.frozen
class Opt:
    """One option: spellings as llama.cpp lists them, and where its value goes."""

    args: tuple[str, ...]
    help: str
    hint: str | None = None  # value hint; None for a flag
    neg: tuple[str, ...] = ()  # "--no-..." spellings of a boolean option
    env: str | None = None
    dest: str | None = None  # key in ParsedArgs.values; None: accepted and ignored
    section: str = "example-specific params"

    def to_string(self) -> str:
        """llama.cpp ``common_arg::to_string``, line for line."""
        all_args = [*self.args, *self.neg]
        out = ""
        for i, arg in enumerate(all_args):
            if i == 0:
                if len(all_args) == 1:
                    out += arg
                else:
                    tmp = arg + ", "
                    out += tmp + " " * max(0, 7 - len(tmp))
            else:
                out += arg + (", " if i != len(all_args) - 1 else "")
        if self.hint:
            out += " " + self.hint
        if len(out) > _HELP_COLUMN - 3:
            out += "\n" + " " * _HELP_COLUMN
        else:
            out += " " * (_HELP_COLUMN - len(out))
        text = self.help + (f"\n(env: {self.env})" if self.env else "")
        lines = _break_lines(text, _HELP_WIDTH)
        return out + "".join(
            ("" if j == 0 else " " * _HELP_COLUMN) + line + "\n" for j, line in enumerate(lines)
        )


def _break_lines(text: str, width: int) -> list[str]:
    """llama.cpp ``break_str_into_lines``: keep short lines, word-wrap long ones."""
    result: list[str] = []
    for line in text.split("\n"):
        if len(line) <= width:
            result.append(line)
            continue
        current = ""
        for word in line.split():
            if len(current) + (1 if current else 0) + len(word) > width:
                if current:
                    result.append(current)
                current = word
            else:
                current += (" " if current else "") + word
        if current:
            result.append(current)
    return result


def _o(args: str, help: str, hint: str | None = None, **kw: object) -> Opt:
    neg = kw.pop("neg", "")
    assert isinstance(neg, str)
    return Opt(
        args=tuple(args.split(",")),
        neg=tuple(neg.split(",")) if neg else (),
        help=help,
        hint=hint,
        **kw,  # type: ignore[arg-type]
    )


_C, _S = "common params", "sampling params"

# Help texts follow llama.cpp (the pinned build) with its default values filled in.
OPTIONS: tuple[Opt, ...] = (
    _o("-h,--help,--usage", "print usage and exit", section=_C, dest="help"),
    _o("--version", "show version and build info", section=_C, dest="version"),
    _o("-t,--threads", "number of CPU threads to use during generation (default: -1)", "N",
       env="LLAMA_ARG_THREADS", section=_C),
    _o("-c,--ctx-size", "size of the prompt context (default: 0, 0 = loaded from model)", "N",
       env="LLAMA_ARG_CTX_SIZE", section=_C, dest="ctx_size"),
    _o("-n,--predict,--n-predict", "number of tokens to predict (default: -1, -1 = infinity)",
       "N", env="LLAMA_ARG_N_PREDICT", section=_C, dest="n_predict"),
    _o("-b,--batch-size", "logical maximum batch size (default: 2048)", "N",
       env="LLAMA_ARG_BATCH", section=_C),
    _o("-fa,--flash-attn", "set Flash Attention use ('on', 'off', or 'auto', default: 'auto')",
       "[on|off|auto]", env="LLAMA_ARG_FLASH_ATTN", section=_C),
    _o("-mm,--mmproj", "path to a multimodal projector file. see tools/mtmd/README.md\n"
       "note: if -hf is used, this argument can be omitted", "FILE", env="LLAMA_ARG_MMPROJ",
       section=_C, dest="mmproj"),
    _o("-lm,--load-mode", "model loading mode (default: auto)\n"
       "- auto: mmap, unless a device does not support it\n"
       "- none: no special loading mode\n"
       "- mmap: memory-map model (if mmap disabled, slower load but may reduce pageouts if not "
       "using mlock)\n"
       "- mlock: force system to keep model in RAM rather than swapping or compressing\n"
       "- mmap+mlock: mmap + force system to keep model in RAM rather than swapping or "
       "compressing\n"
       "- dio: use DirectIO if available\n", "MODE", env="LLAMA_ARG_LOAD_MODE", section=_C),
    _o("-ngl,--gpu-layers,--n-gpu-layers", "max. number of layers to store in VRAM, either an "
       "exact number, 'auto', or 'all' (default: auto)", "N", env="LLAMA_ARG_N_GPU_LAYERS",
       section=_C),
    _o("-fit,--fit", "whether to adjust unset arguments to fit in device memory ('on' or 'off', "
       "default: 'on')", "[on|off]", env="LLAMA_ARG_FIT", section=_C),
    _o("-m,--model", "model path to load", "FNAME", env="LLAMA_ARG_MODEL", section=_C,
       dest="model"),
    _o("-hf,-hfr,--hf-repo", "Hugging Face model repository; quant is optional, "
       "case-insensitive, default to Q4_K_M, or falls back to the first file in the repo if "
       "Q4_K_M doesn't exist.\n"
       "mmproj is also downloaded automatically if available. to disable, add --no-mmproj\n"
       "example: ggml-org/GLM-4.7-Flash-GGUF:Q4_K_M\n"
       "(default: unused)", "<user>/<model>[:quant]",
       env="LLAMA_ARG_HF_REPO", section=_C, dest="hf_repo"),
    _o("-hft,--hf-token", "Hugging Face access token (default: value from HF_TOKEN "
       "environment variable)", "TOKEN", env="HF_TOKEN", section=_C),
    _o("--offline", "Offline mode: forces use of cache, prevents network access",
       env="LLAMA_ARG_OFFLINE", section=_C),
    _o("-v,--verbose,--log-verbose", "Set verbosity level to infinity (i.e. log all messages, "
       "useful for debugging)", section=_C),
    _o("--log-colors", "Set colored logging ('on', 'off', or 'auto', default: 'auto')\n"
       "'auto' enables colors when output is to a terminal", "[on|off|auto]",
       env="LLAMA_ARG_LOG_COLORS", section=_C, dest="log_colors"),
    _o("-lv,--verbosity,--log-verbosity", "Set the verbosity threshold. Messages with a higher "
       "verbosity will be ignored. Values:\n - 0: generic output\n - 1: error\n - 2: warning\n"
       " - 3: info\n - 4: trace (more info)\n - 5: debug\n(default: 3)\n", "N",
       env="LLAMA_ARG_LOG_VERBOSITY", section=_C),
    _o("--temp,--temperature", "temperature (default: 0.80)", "N",
       env="LLAMA_ARG_TEMPERATURE", section=_S),
    _o("-s,--seed", "RNG seed (default: -1, use random seed for -1)", "SEED", section=_S),
    _o("-a,--alias", "set model name aliases, comma-separated (to be used by API)", "STRING",
       env="LLAMA_ARG_ALIAS", dest="alias"),
    _o("--tags", "set model tags, comma-separated (informational, not used for routing)",
       "STRING", env="LLAMA_ARG_TAGS", dest="tags"),
    _o("--host", "IP addresses to listen on, comma-separated, or UNIX socket paths ending in "
       ".sock; with multiple TCP addresses, :: binds IPv6 only; overlapping addresses result in "
       "undefined behavior (default: 127.0.0.1)", "HOST", env="LLAMA_ARG_HOST", dest="host"),
    _o("--port", "port to listen (default: 8080)", "PORT", env="LLAMA_ARG_PORT", dest="port"),
    _o("--api-prefix", "prefix path the server serves from, without the trailing slash "
       "(default: )", "PREFIX", env="LLAMA_ARG_API_PREFIX", dest="api_prefix"),
    _o("--ui,--webui", "whether to enable the Web UI (default: enabled)",
       neg="--no-ui,--no-webui", env="LLAMA_ARG_UI"),
    _o("--embedding,--embeddings", "restrict to only support embedding use case; use only with "
       "dedicated embedding models (default: disabled)", env="LLAMA_ARG_EMBEDDINGS"),
    _o("--api-key", "API key to use for authentication, multiple keys can be provided as a "
       "comma-separated list (default: none)", "KEY", env="LLAMA_API_KEY", dest="api_key"),
    _o("-to,--timeout", "server read/write timeout in seconds (default: 3600)", "N",
       env="LLAMA_ARG_TIMEOUT"),
    _o("--threads-http", "number of threads used to process HTTP requests (default: -1)", "N",
       env="LLAMA_ARG_THREADS_HTTP"),
    _o("--metrics", "enable prometheus compatible metrics endpoint (default: disabled)",
       env="LLAMA_ARG_ENDPOINT_METRICS"),
    _o("--slots", "expose slots monitoring endpoint (default: enabled)", neg="--no-slots",
       env="LLAMA_ARG_ENDPOINT_SLOTS"),
    _o("-np,--parallel", "number of server slots (default: -1, -1 = auto)", "N",
       env="LLAMA_ARG_N_PARALLEL", dest="parallel"),
    _o("--models-dir", "directory containing models for the router server (default: disabled)",
       "PATH", env="LLAMA_ARG_MODELS_DIR"),
    _o("--models-preset", "path to INI file containing model presets for the router server "
       "(default: disabled)", "PATH", env="LLAMA_ARG_MODELS_PRESET"),
    _o("--models-max", "for router server, maximum number of models to load simultaneously "
       "(default: 4, 0 = unlimited)", "N", env="LLAMA_ARG_MODELS_MAX"),
    _o("--models-autoload", "for router server, whether to automatically load models "
       "(default: enabled)", neg="--no-models-autoload", env="LLAMA_ARG_MODELS_AUTOLOAD"),
    _o("--jinja", "whether to use jinja template engine for chat (default: enabled)",
       neg="--no-jinja", env="LLAMA_ARG_JINJA"),
    _o("--sleep-idle-seconds", "number of seconds of idleness after which the server will "
       "sleep (default: -1; -1 = disabled)", "SECONDS", dest="sleep_idle_seconds"),
)  # fmt: skip


def knob(name: str, help: str, hint: str | None = None) -> Opt:
    """A fault-injection knob: ``--fake-<name>``, env ``TROUPE_FAKE_<NAME>``."""
    env = "TROUPE_FAKE_" + name.upper().replace("-", "_")
    return Opt(
        args=(f"--fake-{name}",),
        help=help,
        hint=hint,
        env=env,
        dest="fake_" + name.replace("-", "_"),
        section="fake engine knobs",
    )


@attrs.frozen
class ParsedArgs:
    values: dict[str, str]  # dest -> raw value ("1" for a set flag, "0" for a negated one)
    ignored: tuple[str, ...]  # unknown words, for a log line


def render_help(options: Sequence[Opt]) -> str:
    """The whole ``--help`` output, sections in llama.cpp's order."""
    order = ["common params", "sampling params", "example-specific params"]
    order += sorted({o.section for o in options} - set(order))
    out = ""
    for section in order:
        opts = [o for o in options if o.section == section]
        if opts:
            out += ("\n\n" if out else "") + f"----- {section} -----\n\n"
            out += "".join(o.to_string() for o in opts)
    return out


def parse_args(
    argv: Sequence[str], options: Sequence[Opt], environ: Mapping[str, str] | None = None
) -> ParsedArgs:
    """Env first, then the command line (llama.cpp's order); never fails."""
    env = os.environ if environ is None else environ
    table: dict[str, tuple[Opt, bool]] = {}
    for opt in options:
        table.update({a: (opt, True) for a in opt.args})
        table.update({a: (opt, False) for a in opt.neg})
    values: dict[str, str] = {}
    for opt in options:
        if opt.dest is None or opt.env is None:
            continue
        if opt.neg and opt.env.replace("LLAMA_ARG_", "LLAMA_ARG_NO_") in env:
            values[opt.dest] = "0"
        elif opt.env in env:
            values[opt.dest] = env[opt.env]
    ignored: list[str] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        name, eq, inline = word.partition("=")
        if name.startswith("--"):
            name = name.replace("_", "-")
        found = table.get(name)
        has_next = i + 1 < len(argv)
        if found is None:
            ignored.append(word)
            if not eq and has_next and not argv[i + 1].startswith("-"):
                ignored.append(argv[i + 1])
                i += 1
        else:
            opt, positive = found
            if opt.hint is None:
                value = "1" if positive else "0"
            elif eq:
                value = inline
            elif has_next:
                value = argv[i + 1]
                i += 1
            else:
                value = ""
            if opt.dest is not None:
                values[opt.dest] = value
        i += 1
    return ParsedArgs(values=values, ignored=tuple(ignored))
