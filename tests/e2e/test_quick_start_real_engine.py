"""The README's quick start, from a clean clone: its documented ``troupe serve`` command
on a models directory, then its documented request, answered by the real engine.

The clone holds only what is committed, so a quick start that needs a file nobody
committed fails here. The engine is the one already installed (no reinstall)."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
import trio

from troupe_rig.process import start_troupe

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]


def _section(readme: str, heading: str) -> str:
    start = readme.index(f"\n## {heading}\n")
    end = readme.find("\n## ", start + 1)
    return readme[start : end if end > 0 else None]


def quick_start(readme: str) -> tuple[list[str], str, dict[str, object]]:
    """The serve command's arguments, and the documented request's path and body."""
    section = _section(readme, "Serve your own models")
    blocks = re.findall(r"^```sh\n(.*?)^```", section, re.S | re.M)
    serve = next(b for b in blocks if b.startswith("troupe serve "))
    args = shlex.split(serve.strip())[2:]
    curl = shlex.split(next(b for b in blocks if b.startswith("curl ")).replace("\\\n", " "))
    url = next(w for w in curl if w.startswith("http://"))
    body = json.loads(curl[curl.index("-d") + 1])
    return args, "/" + url.split("/", 3)[3], body


def test_the_quick_start_is_read_from_the_readme() -> None:
    args, path, body = quick_start((ROOT / "README.md").read_text())
    assert "--models-dir" in args
    assert path.startswith("/v1/")
    assert isinstance(body["model"], str)


def _clone(clone: Path, tiny_models: Path) -> tuple[list[str], str, dict[str, object]]:
    """A clean clone with the tiny models in the README's models directory; the README's
    quick start as `quick_start` reads it."""
    subprocess.run(
        ["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)],
        check=True,
        timeout=120,
    )
    args, path, body = quick_start((clone / "README.md").read_text())
    models = clone / args[args.index("--models-dir") + 1]
    models.mkdir(parents=True)
    for gguf in tiny_models.glob("*.gguf"):
        shutil.copy(gguf, models / gguf.name)
    return args, path, body


async def test_the_readme_quick_start_from_a_clean_clone(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    if not (ROOT / ".git").exists():
        pytest.fail("the quick-start test clones the repository: run it from a git checkout")
    clone = tmp_path / "troupe"
    args, path, body = await trio.to_thread.run_sync(_clone, clone, tiny_model_dir)
    body["model"] = "tiny-a"  # the README's example name, for a model this directory has
    troupe = await start_troupe(
        args,
        state_dir=tmp_path / "state",
        cwd=clone,
        # The clone's code, not this checkout's; the engine already installed.
        env={"PYTHONPATH": str(clone / "src"), "TROUPE_ENGINE": str(engine_path)},
    )
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(troupe.drain_log)
            async with httpx.AsyncClient(base_url=troupe.url, timeout=120) as http:
                answer = await http.post(path, json=body)
            nursery.cancel_scope.cancel()
    finally:
        troupe.process.terminate()
        with trio.fail_after(30):
            await troupe.process.wait()
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] > 0
