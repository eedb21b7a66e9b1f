"""``troupe cluster watch`` keeps the balancer's configuration current as a user runs
it: a subprocess against real troupe nodes, the node list edited by hand, the config
checked by HAProxy and the reload command run once per change, never for a node that
only stopped answering."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import trio

from troupe_rig.router import RouterFactory


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


class Lines:
    """The watch's stdout, a line at a time."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def until(self, fragment: str) -> str:
        with trio.fail_after(60):
            while True:
                line, sep, rest = self.buffer.partition(b"\n")
                if sep:
                    self.buffer = rest
                    text = line.decode()
                    if fragment in text:
                        return text
                    continue
                chunk = await self.stream.receive_some(4096)
                assert chunk, f"the watch ended before '{fragment}'"
                self.buffer += chunk


async def test_watch_follows_the_node_list_and_catalogs(
    fake_router: RouterFactory, tmp_path: Path, haproxy_path: Path
) -> None:
    nodes = tmp_path / "nodes.txt"
    out = tmp_path / "haproxy.cfg"
    reloads = tmp_path / "reloads.txt"
    async with fake_router({"alpha": {}, "beta": {}}) as one:
        nodes.write_text(one.url + "\n")
        argv = [
            sys.executable, "-m", "troupe", "cluster", "watch", "--nodes", str(nodes),
            "--bind", f"127.0.0.1:{_free_port()}", "--out", str(out), "--every", "0.05",
            "--reload", f"echo reload >> {reloads}",
        ]  # fmt: skip
        env = {**os.environ, "PATH": f"{haproxy_path.parent}:{os.environ.get('PATH', '')}"}
        proc = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE, env=env)
        assert proc.stdout is not None
        lines = Lines(proc.stdout)
        try:
            assert "1 nodes, 2 models" in await lines.until("wrote")
            await lines.until("reloaded")
            first = out.read_text()
            assert "alpha" in first
            assert "beta" in first
            assert one.url.split("//")[1] in first

            async with fake_router({"gamma": {}}) as two:
                # A second node: one line in the list, nothing else.
                nodes.write_text(f"{one.url}\n{two.url}\n")
                assert "2 nodes, 3 models" in await lines.until("wrote")
                await lines.until("reloaded")
                assert "gamma" in out.read_text()
            # The second node is gone (its health checks take it out): its models keep
            # their backends, no reload. The next change is the list's third line.
            closed = f"http://127.0.0.1:{_free_port()}"
            nodes.write_text(f"{one.url}\n{two.url}\n{closed}\n")
            assert "3 nodes, 3 models" in await lines.until("wrote")
            await lines.until("reloaded")
            third = out.read_text()
            assert "gamma" in third
            assert closed.split("//")[1] in third
            checked = await trio.run_process(
                [str(haproxy_path), "-c", "-q", "-f", str(out)], capture_stderr=True, check=False
            )
            assert checked.returncode == 0, checked.stderr
            assert reloads.read_text().splitlines() == ["reload"] * 3
        finally:
            proc.send_signal(signal.SIGTERM)
            with trio.fail_after(10):
                code = await proc.wait()
            await proc.stdout.aclose()
    assert code == 0
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]
