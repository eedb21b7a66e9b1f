"""The Host check against DNS rebinding (the class of Ollama's CVE-2024-28224).

A web page the user opens can make the browser send requests to a name its author
controls that then resolves to 127.0.0.1: same origin to the browser, so CORS does
not stop it. What gives it away is ``Host``: the attacker's domain name. So when
every address troupe listens on is a loopback one, a request whose Host is a dotted
name other than ``localhost`` and ``*.localhost`` and not one of ``--allowed-hosts``
is refused (403); IP addresses and names without a dot cannot be rebound and pass.
Listening on any other address is a choice to be reached by other names, and
nothing is checked; ``--allowed-hosts *`` turns the check off.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

__all__ = ["HostCheck"]


def _is_loopback(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _cannot_rebind(host: str) -> bool:
    """A Host no web page can rebind: an IP address (no DNS is asked, so the browser
    connects where it says: a page can only name 127.0.0.1 by naming it), a loopback
    name, or a name without a dot (an nginx upstream's name, this machine's name: not
    an attacker's domain)."""
    if _is_loopback(host) or "." not in host:
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def host_name(authority: bytes) -> str:
    """The name in ``host[:port]`` or ``[v6]:port``, lower-case, without a final dot."""
    text = authority.decode("latin-1").strip().lower()
    if text.startswith("["):
        end = text.find("]")
        text = text[1:end] if end > 0 else text
    else:
        name, sep, port = text.rpartition(":")
        if sep and port.isdigit():
            text = name
    return text.rstrip(".")


class HostCheck:
    def __init__(self, listen: Iterable[str], allowed: Iterable[str]) -> None:
        tcp = [h.strip("[]").lower() for h in listen if not h.endswith(".sock")]
        self.allowed = frozenset(a.lower().rstrip(".") for a in allowed)
        self.active = bool(tcp) and all(_is_loopback(h) for h in tcp) and "*" not in self.allowed
        self._seen: dict[bytes, bool] = {}  # authority -> verdict (a few values in practice)

    def allows(self, authority: bytes) -> bool:
        if not self.active or not authority:
            return True  # an HTTP/1.0 request may come without a Host
        verdict = self._seen.get(authority)
        if verdict is None:
            name = host_name(authority)
            verdict = _cannot_rebind(name) or name in self.allowed
            if len(self._seen) < 256:
                self._seen[authority] = verdict
        return verdict
