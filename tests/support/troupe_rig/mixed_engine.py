"""An engine launcher that runs the real ``llama-server`` unless a fault knob asks for the fake.

One router can then serve real models and fault-injecting ones side by side: a preset
section with ``fake-oom = on`` (or any other ``--fake-*`` knob) gets the fake engine,
every other model the real one. ``--help`` prints the real engine's options followed by
the fake's knob section, so troupe accepts the knobs as preset keys.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from troupe_rig import _ROOT, fake_engine_argv

__all__ = ["write_mixed_engine"]


def write_mixed_engine(
    directory: str | os.PathLike[str], real: str | os.PathLike[str], name: str = "llama-server"
) -> Path:
    """Write ``directory/name``: ``real`` for every command line without a ``--fake-*``
    argument, the fake engine for those with one."""
    from troupe_rig.fake_engine.config import KNOBS  # noqa: PLC0415 (keeps imports light)
    from troupe_rig.fake_engine.options import render_help  # noqa: PLC0415

    path = Path(directory) / name
    knobs = path.with_name(f"{name}.knobs")
    path.parent.mkdir(parents=True, exist_ok=True)
    knobs.write_text(render_help(KNOBS))
    fake = " ".join(shlex.quote(a) for a in fake_engine_argv())
    script = (
        "#!/bin/sh\n"
        "# real llama-server, or troupe's fake engine when a --fake-* knob is given\n"
        "# (troupe_rig.mixed_engine.write_mixed_engine)\n"
        f"real={shlex.quote(str(Path(real).resolve()))}\n"
        'for arg in "$@"; do\n'
        '  case "$arg" in\n'
        "    -h|--help|--usage)\n"
        '      "$real" --help; status=$?\n'
        f"      printf '\\n\\n'; cat {shlex.quote(str(knobs))}; echo; exit $status ;;\n"
        "    --fake-*)\n"
        f'      export PYTHONPATH={shlex.quote(str(_ROOT))}"${{PYTHONPATH:+:$PYTHONPATH}}"\n'
        f'      exec {fake} "$@" ;;\n'
        "  esac\n"
        "done\n"
        'exec "$real" "$@"\n'
    )
    tmp = path.with_name(f".{name}.tmp")
    tmp.write_text(script)
    tmp.chmod(0o755)
    tmp.replace(path)
    return path
