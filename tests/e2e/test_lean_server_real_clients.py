"""The lean server with the real engine and real clients: the openai SDK (streamed and
not), curl (a body large enough for ``Expect: 100-continue``, a UNIX socket), and nginx
in front with keep-alive upstream connections, as configs/nginx-troupe.conf sets it."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from functools import partial
from pathlib import Path

import openai
import pytest
import trio

from troupe_rig.router import open_router

pytestmark = pytest.mark.engine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _openai_calls(base_url: str) -> tuple[str, list[str]]:
    client = openai.OpenAI(base_url=base_url + "/v1", api_key="none", max_retries=0)
    whole = client.completions.create(model="tiny-a", prompt="hello", max_tokens=4)
    pieces = [
        chunk.choices[0].text
        for chunk in client.completions.create(
            model="tiny-a", prompt="hello", max_tokens=8, stream=True
        )
        if chunk.choices
    ]
    client.close()
    return whole.choices[0].text, pieces


async def _curl(*args: str) -> str:
    done = await trio.run_process(
        ["curl", "-sS", "--max-time", "60", *args], capture_stdout=True, check=True
    )
    return done.stdout.decode()


async def test_openai_sdk_curl_and_a_unix_socket(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    sock = tmp_path / "t.sock"
    args = ["--models-dir", str(tiny_model_dir), "--ctx-size", "256", "--host", f"127.0.0.1,{sock}"]
    async with open_router(args, engine=engine_path, state_dir=tmp_path / "s") as router:
        text, pieces = await trio.to_thread.run_sync(_openai_calls, router.url)
        assert isinstance(text, str)
        assert len(pieces) >= 2  # streamed, not one buffered answer
        big = json.dumps({"model": "tiny-a", "content": "word " * 300_000})  # 1.5 MB
        (tmp_path / "big.json").write_text(big)
        out = await _curl(
            "-H", "Content-Type: application/json", "--data-binary", f"@{tmp_path / 'big.json'}",
            router.url + "/tokenize",
        )  # fmt: skip
        assert len(json.loads(out)["tokens"]) > 1000  # curl sent Expect: 100-continue first
        out = await _curl("--unix-socket", str(sock), "http://x/health")
        assert json.loads(out) == {"status": "ok"}
        with trio.fail_after(10):
            await router.ctx.scheduler.wait_until(lambda s: s.models["tiny-a"].in_flight == 0)


@pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed")
async def test_behind_nginx_with_keep_alive_upstreams(
    engine_path: Path, tiny_model_dir: Path, tmp_path: Path
) -> None:
    args = ["--models-dir", str(tiny_model_dir), "--ctx-size", "256"]
    async with open_router(args, engine=engine_path, state_dir=tmp_path / "s") as router:
        port = _free_port()
        conf = tmp_path / "nginx.conf"
        conf.write_text(
            f"daemon off; pid {tmp_path}/nginx.pid; error_log {tmp_path}/error.log;\n"
            "events {}\n"
            f"http {{ access_log off; client_body_temp_path {tmp_path};\n"
            f"  upstream troupe {{ server {router.url.removeprefix('http://')}; keepalive 8; }}\n"
            f"  server {{ listen 127.0.0.1:{port};\n"
            "    location / { proxy_pass http://troupe; proxy_http_version 1.1;\n"
            '      proxy_set_header Connection ""; proxy_buffering off; } } }\n'
        )
        async with trio.open_nursery() as nursery:
            nginx = partial(
                trio.run_process, ["nginx", "-c", str(conf), "-p", str(tmp_path)], check=False
            )
            proc = await nursery.start(nginx)
            try:
                url = f"http://127.0.0.1:{port}"
                with trio.fail_after(10):
                    while True:
                        try:
                            out = await _curl(url + "/health")
                            break
                        except subprocess.CalledProcessError:
                            await trio.sleep(0.05)  # nginx is binding its port
                assert json.loads(out) == {"status": "ok"}
                for _ in range(3):  # several requests over nginx's pooled connections
                    _, pieces = await trio.to_thread.run_sync(_openai_calls, url)
                    assert len(pieces) >= 2
            finally:
                proc.terminate()
