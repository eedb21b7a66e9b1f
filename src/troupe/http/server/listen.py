"""Listening sockets for ``--host`` (comma-separated addresses, IPv6, ``*.sock``) and TLS.

``--port 0`` gives each TCP address its own free port (as hypercorn did); the URLs
reported are the ones actually bound. A UNIX socket path is unlinked before binding
(a stale file from a crashed run would refuse it) and after the server stops.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import ssl
import stat
from pathlib import Path

import attrs
import trio

from troupe.errors import ConfigError
from troupe.settings.router import RouterSettings

__all__ = ["Bound", "open_listeners", "tls_context"]

BACKLOG = 4096


@attrs.define
class Bound:
    listeners: list[trio.abc.Listener[trio.abc.Stream]]
    urls: list[str]
    unix_paths: list[Path]

    def remove_unix_sockets(self) -> None:
        for path in self.unix_paths:
            with contextlib.suppress(OSError):
                path.unlink()


def tls_context(settings: RouterSettings) -> ssl.SSLContext | None:
    if not (settings.ssl_cert_file and settings.ssl_key_file):
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(str(settings.ssl_cert_file), str(settings.ssl_key_file))
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            f"cannot load --ssl-cert-file {settings.ssl_cert_file} / --ssl-key-file "
            f"{settings.ssl_key_file}: {exc}"
        ) from None
    context.set_alpn_protocols(["http/1.1"])
    return context


def _url(scheme: str, sockname: tuple[str, int] | tuple[str, int, int, int]) -> str:
    host, port = sockname[0], sockname[1]
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def _remove_stale_socket(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(path.stat().st_mode):
            path.unlink()  # a socket file left behind by a run that died


async def _unix_listener(path: Path) -> trio.SocketListener:
    _remove_stale_socket(path)  # one stat at start-up: not worth a thread
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        await sock.bind(os.fspath(path))
        sock.listen(BACKLOG)
    except BaseException:
        sock.close()
        raise
    return trio.SocketListener(sock)


def _bind_error(host: str, port: int, exc: OSError) -> ConfigError:
    """A bind the user's flags made fail, as one line naming the address and the cause."""
    where = host if host.endswith(".sock") else f"{host}:{port}"
    if isinstance(exc, socket.gaierror):
        return ConfigError(f"--host {host}: not an address this machine has ({exc.strerror})")
    if exc.errno == errno.EADDRINUSE:
        why = "the address is already in use (another server listens there?)"
    elif exc.errno == errno.EACCES:
        why = "permission denied" + (" (ports below 1024 need privileges)" if port < 1024 else "")
    elif exc.errno == errno.EADDRNOTAVAIL:
        why = "not an address of this machine"
    else:
        why = exc.strerror or str(exc)
    return ConfigError(f"cannot listen on {where}: {why}")


async def open_listeners(settings: RouterSettings) -> Bound:
    """Bind every ``--host``; a failure closes what was bound and raises ConfigError."""
    context = tls_context(settings)
    scheme = "https" if context is not None else "http"
    bound = Bound([], [], [])
    try:
        for host in settings.hosts:
            try:
                await _listen(bound, host, settings.port, scheme)
            except OSError as exc:
                raise _bind_error(host, settings.port, exc) from None
    except BaseException:
        for opened in bound.listeners:
            with contextlib.suppress(Exception):
                await opened.aclose()
        bound.remove_unix_sockets()
        raise
    if context is not None:
        bound.listeners = [
            trio.SSLListener(listener, context, https_compatible=True)
            for listener in bound.listeners
        ]
    return bound


async def _listen(bound: Bound, host: str, port: int, scheme: str) -> None:
    if host.endswith(".sock"):
        path = Path(host)
        bound.listeners.append(await _unix_listener(path))
        bound.unix_paths.append(path)
        bound.urls.append(f"unix:{path}")
        return
    tcp_listeners = await trio.open_tcp_listeners(port, host=host, backlog=BACKLOG)
    for tcp in tcp_listeners:
        bound.listeners.append(tcp)
        bound.urls.append(_url(scheme, tcp.socket.getsockname()))
