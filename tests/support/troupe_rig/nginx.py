"""Real nginx in front of troupe, with the shipped site ``configs/nginx-troupe.conf``.

The site is used as shipped except for two lines: it listens on a loopback port
instead of ``443 ssl http2``, and its upstream points at the port given. Everything
nginx writes (pid, logs, temporary files) stays in the directory given.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import attrs
import trio

from troupe_rig.engine_process import free_port
from troupe_rig.reaper import guard

__all__ = ["NGINX", "SITE", "Forwarder", "Nginx", "adapt_site", "open_forwarder", "open_nginx"]

NGINX = Path("/usr/sbin/nginx")  # Debian's package
SITE = Path(__file__).resolve().parents[3] / "configs" / "nginx-troupe.conf"
_LISTEN = "listen 443 ssl http2;"
_UPSTREAM = "server 127.0.0.1:8080;"

_MAIN = """\
{user}worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log info;
events {{ worker_connections 1024; }}
http {{
    access_log {dir}/access.log;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    include {dir}/troupe-site.conf;
}}
"""


def adapt_site(text: str, listen_port: int, upstream_port: int) -> str:
    """The shipped site with only its listen line and upstream port changed."""
    for line in (_LISTEN, _UPSTREAM):
        if text.count(line) != 1:
            raise ValueError(f"{SITE.name} no longer has exactly one '{line}'")
    text = text.replace(_LISTEN, f"listen 127.0.0.1:{listen_port};")
    return text.replace(_UPSTREAM, f"server 127.0.0.1:{upstream_port};")


@attrs.frozen
class Nginx:
    port: int
    directory: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def error_log(self) -> str:
        return (self.directory / "error.log").read_text(errors="replace")


async def _wait_listening(port: int, process: trio.Process, directory: Path) -> None:
    with trio.fail_after(20):
        while True:
            try:
                stream = await trio.open_tcp_stream("127.0.0.1", port)
            except OSError:
                if process.returncode is not None:
                    log = (directory / "error.log").read_text(errors="replace")
                    raise RuntimeError(f"nginx exited ({process.returncode}): {log}") from None
                await trio.sleep(0.02)  # nginx says nothing on stdout when it is up
                continue
            await stream.aclose()
            return


def write_config(
    directory: Path, port: int, upstream_port: int, site: Path, binary: Path
) -> list[str]:
    """Write nginx.conf and the adapted site into ``directory``; the command to run."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "troupe-site.conf").write_text(adapt_site(site.read_text(), port, upstream_port))
    # As root, workers would switch to "nobody", who cannot write in a private temp dir.
    user = "user root root;\n" if os.geteuid() == 0 else ""
    (directory / "nginx.conf").write_text(_MAIN.format(user=user, dir=directory))
    conf, errors = directory / "nginx.conf", directory / "error.log"
    return [str(binary), "-p", str(directory), "-c", str(conf), "-e", str(errors)]


@contextlib.asynccontextmanager
async def open_nginx(
    directory: Path, upstream_port: int, site: Path = SITE, binary: Path = NGINX
) -> AsyncIterator[Nginx]:
    """Run nginx until the block ends (then SIGTERM, and SIGKILL if it lingers)."""
    port = free_port()
    argv = write_config(directory, port, upstream_port, site, binary)
    process = await trio.lowlevel.open_process(
        argv, stdin=subprocess.DEVNULL, start_new_session=True
    )
    guard(process.pid)  # its workers too, if this process dies
    try:
        await _wait_listening(port, process, directory)
        yield Nginx(port, directory)
    finally:
        with trio.CancelScope(shield=True):
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            with trio.move_on_after(10):
                await process.wait()
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()


@attrs.define
class Forwarder:
    """A TCP pipe to ``target`` that counts the connections made to it."""

    port: int
    target: int
    connections: int = 0


@contextlib.asynccontextmanager
async def open_forwarder(target: int) -> AsyncIterator[Forwarder]:
    """Listen on a free loopback port and pipe every connection to ``target`` untouched
    (to count what nginx opens to troupe)."""
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    forwarder = Forwarder(listeners[0].socket.getsockname()[1], target)

    async def pipe(client: trio.SocketStream) -> None:
        forwarder.connections += 1
        async with (
            client,
            await trio.open_tcp_stream("127.0.0.1", target) as server,
            trio.open_nursery() as nursery,
        ):

            async def one_way(src: trio.SocketStream, dst: trio.SocketStream) -> None:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    while data := await src.receive_some(65536):
                        await dst.send_all(data)
                nursery.cancel_scope.cancel()  # either side closing ends both

            nursery.start_soon(one_way, client, server)
            nursery.start_soon(one_way, server, client)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, pipe, listeners)
        try:
            yield forwarder
        finally:
            nursery.cancel_scope.cancel()
