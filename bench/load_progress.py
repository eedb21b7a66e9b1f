"""Load progress: how soon a streamed request for a model that takes a while to load
hears from troupe, with ``--load-progress`` on and off.

The fake engine loads for ``--load-time`` seconds (20 by default, reporting its staged
progress as llama-server does); one streamed chat completion asks for it. Printed for
each setting: the head's arrival, the progress comments, the first token.

    .venv/bin/python bench/load_progress.py [--load-time SECONDS]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import httpx
import trio

from troupe_rig import write_fake_engine
from troupe_rig.router import open_router, write_preset


async def _one(engine: Path, load_time: float, mode: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        preset = write_preset(d, {"slow": {"fake-load-time": f"{load_time:g}"}})
        args = ["--models-preset", str(preset), "--load-progress", mode]
        async with (
            open_router(args, engine=engine, state_dir=d / "s", cwd=d) as router,
            httpx.AsyncClient(base_url=router.url, timeout=load_time + 60) as http,
        ):
            messages = [{"role": "user", "content": "hi"}]
            body = {"model": "slow", "messages": messages, "stream": True}
            asked = time.monotonic()
            comments, token = 0, None
            async with http.stream("POST", "/v1/chat/completions", json=body) as resp:
                head = time.monotonic() - asked
                async for line in resp.aiter_lines():
                    comments += line.startswith(":")
                    if token is None and line.startswith("data: {"):
                        token = time.monotonic() - asked
    first = f"{token:.2f} s" if token is not None else "-"
    return f"{mode:>9}: head {head:6.2f} s, {comments:3d} progress comments, first token {first}"


async def main(load_time: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        engine = write_fake_engine(Path(tmp))
        for mode in ("comments", "off"):
            print(await _one(engine, load_time, mode))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load-time", type=float, default=20.0)
    trio.run(main, parser.parse_args().load_time)
