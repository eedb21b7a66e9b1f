"""What ``troupe serve`` imports before it serves: not numpy (the gguf package), not
httpx (downloads: imported when one starts), not werkzeug (multipart bodies: imported
on the first), and no web framework. Each costs idle memory (bench/idle_rss.py)."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("numpy", "gguf", "httpx", "httpcore", "anyio", "werkzeug", "quart", "flask", "jinja2",
         "hypercorn")  # fmt: skip
# Everything `troupe serve` imports: the command, the service and what it builds and runs.
SERVING = ("troupe.cli", "troupe.service", "troupe.assembly", "troupe.specs",
           "troupe.http.serve", "troupe.http.routes", "troupe.realtime")  # fmt: skip


def test_the_serving_path_imports_no_heavy_module() -> None:
    code = (
        "import importlib, json, sys\n"
        f"for name in {SERVING!r}: importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
