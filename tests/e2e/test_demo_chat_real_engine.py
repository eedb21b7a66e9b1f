"""The demo preset chats in Gemma's own format and ends: Gemma 3 270M is a base model
whose GGUF has no chat template, so without configs/gemma3-chat.jinja the engine falls
back to ChatML (the model imitates <|im_end|> and runs on to the context's end), and
without n-predict a chat UI's request with no max_tokens runs for minutes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from troupe.demo import assemble_demo_model
from troupe_rig.router import open_router

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parents[2]


async def test_the_demo_preset_chats_in_gemmas_format_and_stops(
    engine_path: Path, tmp_path: Path
) -> None:
    # scripts/demo's layout: configs/ and models/ under the directory troupe runs in.
    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    assemble_demo_model(tmp_path / "models")
    args = ["--models-preset", "configs/demo.ini", "--ctx-size", "2048"]
    async with (
        open_router(args, engine=engine_path, state_dir=tmp_path / "s", cwd=tmp_path) as router,
        # A cold load of a 270M model on a loaded 2-core machine: a generous bound.
        router.client(timeout=300) as http,
    ):
        messages = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is the capital of France?"},
        ]
        shown = await http.post("/apply-template", json={"model": "gemma", "messages": messages})
        assert shown.status_code == 200, shown.text
        assert shown.json()["prompt"] == (
            "<start_of_turn>user\nBe brief.\n\nWhat is the capital of France?<end_of_turn>\n"
            "<start_of_turn>model\n"
        )
        answer = await http.post(
            "/v1/chat/completions", json={"model": "gemma", "messages": messages, "max_tokens": 4}
        )
        assert answer.status_code == 200, answer.text
        # A request without max_tokens ends after the preset's n-predict (the engine's
        # server-wide cap): its child was started with it.
        items = (await http.get("/models")).json()["data"]
        args = next(m for m in items if m["id"] == "gemma-3-270m")["status"]["args"]
        assert args[args.index("--n-predict") + 1] == "256"
