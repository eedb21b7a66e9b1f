"""A preset section's own flags, judged by the real engine's parser before any request:
the model is rejected with the engine's message, at start-up and on a reload,
and the other models serve."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from troupe_rig.router import open_router, write_preset

pytestmark = pytest.mark.engine

# The engine's own words (its capital E or not depends on the arguments before).
ENGINE_SAYS = 'rror while handling argument "--ctx-size": stoi'


async def test_a_section_the_engine_refuses_is_rejected_with_its_message(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sections = {
        "good": {"model": str(tiny_model_dir / "tiny-a.gguf"), "ctx-size": "256"},
        "bad": {"model": str(tiny_model_dir / "tiny-b.gguf"), "ctx-size": "abc"},
    }
    preset = write_preset(tmp_path, sections)
    args = ["--models-preset", str(preset), "--parallel", "1"]
    caplog.set_level(logging.INFO, logger="troupe.specs")
    async with (
        open_router(args, engine=engine_path, state_dir=tmp_path / "state", cwd=tmp_path) as r,
        r.client() as http,
    ):
        said = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.ERROR]
        assert len(said) == 1
        assert said[0].startswith("preset section [bad]: the engine refuses its flags: ")
        assert said[0].endswith(ENGINE_SAYS)
        listed = {m["id"]: m for m in (await http.get("/models")).json()["data"]}
        assert listed["bad"]["status"]["failed"] is True
        assert ENGINE_SAYS in listed["bad"]["troupe"]["rejected"]
        assert "failed" not in listed["good"]["status"]
        assert listed["good"]["troupe"]["rejected"] is None

        refused = await http.post("/completion", json={"model": "bad", "prompt": "x"})
        assert refused.status_code == 400
        assert ENGINE_SAYS in refused.json()["error"]["message"]
        assert not r.snapshot.models["bad"].pid  # nothing was started for it
        served = await http.post(
            "/completion", json={"model": "good", "prompt": "x", "n_predict": 1}
        )
        assert served.status_code == 200, served.text

        # A reload that breaks the good section and mends the bad one: judged again.
        sections["good"]["n-gpu-layers"] = "lots"
        sections["bad"]["ctx-size"] = "256"
        write_preset(tmp_path, sections)
        listed = {m["id"]: m for m in (await http.get("/models?reload=1")).json()["data"]}
        assert '"--n-gpu-layers"' in listed["good"]["troupe"]["rejected"]
        assert listed["bad"]["troupe"]["rejected"] is None
        mended = await http.post(
            "/completion", json={"model": "bad", "prompt": "x", "n_predict": 1}
        )
        assert mended.status_code == 200, mended.text
        broken = await http.post("/completion", json={"model": "good", "prompt": "x"})
        assert broken.status_code == 400
        assert '"--n-gpu-layers"' in broken.json()["error"]["message"]
