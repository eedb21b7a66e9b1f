"""troupe's /metrics as Prometheus itself reads it (Debian's prometheus package): its
promtool lints the exposition, and a real Prometheus scrapes troupe and answers a
query on the per-model request histograms."""

from __future__ import annotations

import socket
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio

from troupe_rig.router import open_router

pytestmark = pytest.mark.engine

PROMTOOL = Path("/usr/bin/promtool")
PROMETHEUS = Path("/usr/bin/prometheus")
CHILD_ARGS = ("--ctx-size", "256", "--parallel", "1")


def _tool(path: Path) -> Path:
    if not path.is_file():
        pytest.fail(
            f"this test needs {path} (apt-get install prometheus; scripts/test installs it)"
        )
    return path


def _free_port() -> int:
    # Prometheus reports no port it chose itself: take one the kernel just gave out.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_promtool_and_a_real_scrape(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    promtool, prometheus = _tool(PROMTOOL), _tool(PROMETHEUS)
    async with (
        open_router(
            ["--models-dir", str(tiny_model_dir), *CHILD_ARGS],
            engine=engine_path,
            state_dir=tmp_path / "state",
        ) as router,
        router.client() as http,
    ):
        for model in ("tiny-a", "tiny-b"):
            body = {"model": model, "prompt": "hi", "n_predict": 3}
            assert (await http.post("/completion", json=body)).status_code == 200
        exposition = (await http.get("/metrics")).text
        lint = await trio.run_process(
            [str(promtool), "check", "metrics"],
            stdin=exposition.encode(),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
        assert lint.returncode == 0, (lint.stdout + lint.stderr).decode()

        port = _free_port()
        target = router.url.removeprefix("http://")
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: troupe\n    static_configs: [{{targets: ['{target}']}}]\n"
        )
        argv = [
            str(prometheus),
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]
        query = 'sum by (model) (troupe_request_duration_seconds_count{route="/completion"})'
        found: dict[str, float] = {}
        with (tmp_path / "prometheus.log").open("wb") as out:
            async with (
                trio.open_nursery() as nursery,
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as prom,
            ):
                start = partial(trio.run_process, argv, stdout=out, stderr=out, check=False)
                await nursery.start(start)
                # Prometheus has no event to wait on: ask until its first scrapes are in.
                with trio.fail_after(60):
                    while set(found) != {"tiny-a", "tiny-b"}:
                        await trio.sleep(0.5)
                        try:
                            got = (await prom.get("/api/v1/query", params={"query": query})).json()
                        except (httpx.HTTPError, ValueError):
                            continue
                        found = {
                            r["metric"]["model"]: float(r["value"][1])
                            for r in got.get("data", {}).get("result", [])
                        }
                up = (await prom.get("/api/v1/query", params={"query": "up"})).json()
                nursery.cancel_scope.cancel()  # stops Prometheus (SIGTERM, then SIGKILL)
    assert found == {"tiny-a": 1.0, "tiny-b": 1.0}
    assert [r["value"][1] for r in up["data"]["result"]] == ["1"]
