"""A preset whose ``model =`` file does not exist: served as upstream serves it (its load
fails), but its requests' error says why in words, not only the engine's last lines."""

from __future__ import annotations

from pathlib import Path

from troupe_rig.router import RouterFactory


async def test_the_first_request_says_no_such_file(
    fake_router: RouterFactory, tmp_path: Path
) -> None:
    gone = tmp_path / "gone.gguf"
    async with (
        fake_router({"ghost": {"model": str(gone)}, "here": {}}) as router,
        router.client() as http,
    ):
        answer = await http.post("/v1/completions", json={"model": "ghost", "prompt": "x"})
        assert answer.status_code == 500
        message = answer.json()["error"]["message"]
        assert f"model file {gone}: no such file" in message, message
        fine = await http.post("/v1/completions", json={"model": "here", "prompt": "x"})
        assert fine.status_code == 200
