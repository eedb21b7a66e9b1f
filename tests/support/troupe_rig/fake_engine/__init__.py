"""A fake ``llama-server`` that injects the faults a real one will not produce on demand.

Run it as ``python -m troupe_rig.fake_engine <llama-server arguments>``. It
speaks llama-server's command line, HTTP API and router child protocol, and takes
``--fake-*`` knobs (or ``TROUPE_FAKE_*`` environment variables) for slow loads,
crashes, OOM, stubborn shutdowns, pacing and idle sleep. ``--help`` lists them in
llama-server's own format, so troupe learns them as preset keys.
"""

from troupe_rig.fake_engine.config import ALL_OPTIONS, KNOBS, FakeConfig, load_config
from troupe_rig.fake_engine.options import render_help
from troupe_rig.fake_engine.server import main

__all__ = ["ALL_OPTIONS", "KNOBS", "FakeConfig", "help_text", "load_config", "main"]


def help_text() -> str:
    """What ``--help`` prints."""
    return render_help(ALL_OPTIONS)
