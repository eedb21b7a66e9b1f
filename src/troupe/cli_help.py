"""Help texts of the ``troupe`` command, written for someone meeting troupe for the first time."""

from __future__ import annotations

from troupe.settings.table import SETTINGS, Setting

__all__ = ["SERVE_HELP", "TOP_HELP", "render_serve_help"]

TOP_HELP = """\
usage: troupe <command> [options]

troupe runs many llama-server processes behind one OpenAI-compatible endpoint,
loading each model when a request names it and unloading idle ones when the
count or memory limit is reached. It accepts llama-server's router-mode flags
and presets, so `troupe serve` can replace `llama-server` started without -m.

commands:
  serve      run the router (the default when the first word is a flag)
  models     list the models troupe would serve, and their status
  ps         the models a running router has loaded: port, pid, memory, requests
  usage      what each tenant of a running router used, per day and model (tokens, requests)
  doctor     show devices, the engine troupe picked and why, and what fits
  pull       download org/repo[:TAG] from Hugging Face into the HF cache (resumable)
  import     copy or link a local GGUF (and its mmproj) into a --models-dir
  cluster    render an HAProxy configuration for several troupe nodes (troupe cluster --help)

options:
  -h, --help     show this help (and `troupe serve --help` for every flag)
  --version      show troupe's and the engine's version

examples:
  troupe serve --models-dir ./models
  troupe serve --models-preset configs/demo.ini --host 0.0.0.0 --port 8080
  troupe serve --models-dir ./models --models-max 2 --ctx-size 4096
  troupe serve --config configs/troupe.toml
  troupe pull ggml-org/gemma-3-270m-it-GGUF:Q8_0
"""

_SERVE_INTRO = """\
usage: troupe serve [router flags] [llama-server flags]

Serves every model of the catalog (--models-dir, --models-preset, and the
Hugging Face cache) on one endpoint. Each model runs in its own llama-server
child, started on first use. With -m/--model, -hf or -mu, troupe is not a
router: it runs llama-server itself with the same arguments.
"""

_SERVE_OUTRO = """
every other llama-server flag (--ctx-size, --n-gpu-layers, --temp, --jinja, ...)
is accepted, checked against the engine's own option list, and passed to every
child with the highest precedence (it beats the presets). See `llama-server --help`.
"""

_TEXT_COLUMN = 28  # where an entry's text starts; a longer head gets a line of its own


def _head(setting: Setting[object]) -> str:
    assert setting.help is not None
    if setting.help.head is not None:
        return setting.help.head
    head = ", ".join((*setting.spellings, *setting.negatives))
    return f"{head} {setting.hint}" if setting.hint else head


def _entries() -> list[tuple[str, str, list[str]]]:
    """(section, head, text lines) per --help entry, joined settings merged into one."""
    out: list[tuple[str, str, list[str]]] = []
    for setting in SETTINGS:
        help_ = setting.help
        if help_ is None:
            continue
        if help_.joined:
            section, head, lines = out[-1]
            out[-1] = (section, f"{head}, {_head(setting)}", lines)
            continue
        lines = list(help_.text)
        env = f"(env: {setting.env})"
        if help_.env == "inline":
            lines[-1] += f" {env}"
        elif help_.env == "line":
            lines.append(env)
        out.append((help_.section, _head(setting), lines))
    return out


def render_serve_help() -> str:
    """``troupe serve --help``, from the settings table (``troupe.settings.table``)."""
    parts = [_SERVE_INTRO]
    section = ""
    indent = " " * _TEXT_COLUMN
    for entry_section, head, lines in _entries():
        if entry_section != section:
            section = entry_section
            parts.append(f"\n{section}:\n")
        first = f"  {head}"
        if lines and len(first) < _TEXT_COLUMN:
            parts.append(f"{first.ljust(_TEXT_COLUMN)}{lines[0]}\n")
            rest = lines[1:]
        else:
            parts.append(f"{first}\n")
            rest = lines
        parts.extend(f"{indent}{line}\n" for line in rest)
    parts.append(_SERVE_OUTRO)
    return "".join(parts)


SERVE_HELP = render_serve_help()
