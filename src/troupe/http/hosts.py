"""The Host check against DNS rebinding (the class of Ollama's CVE-2024-28224).

A web page the user opens can make the browser send requests to a name its author
controls that then resolves to 127.0.0.1: same origin to the browser, so CORS does
not stop it. What gives it away is ``Host``: the attacker's name, not a loopback
one. So when every address troupe listens on is a loopback one, a request whose
Host is neither a loopback name (``localhost``, ``*.localhost``, 127.0.0.0/8, ::1)
nor one of ``--allowed-hosts`` is refused (403). Listening on any other address is a
choice to be reached by other names, and nothing is checked; ``--allowed-hosts *``
turns the check off.
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
            verdict = _is_loopback(name) or name in self.allowed
            if len(self._seen) < 256:
                self._seen[authority] = verdict
        return verdict
