"""What the HTTP server is told: limits and timeouts (seconds, bytes)."""

from __future__ import annotations

import attrs

__all__ = ["ServerConfig"]


@attrs.frozen
class ServerConfig:
    max_body: int = 128 << 20  # --max-body-mib: a larger request body gets 413
    # Between requests on a keep-alive connection (httplib's default is 5 s too).
    keep_alive_timeout: float = 5.0
    # From a request's first byte to the end of its head, and for a TLS handshake: a
    # client trickling its head (slowloris) is answered 408 and dropped.
    head_timeout: float = 10.0
    # The longest silence while a body arrives (--timeout, upstream's read timeout).
    read_timeout: float = 3600.0
    # From a request's head to the end of its body, whatever its pace (--body-timeout):
    # a body trickled a byte at a time is answered 408 and dropped.
    body_timeout: float = 300.0
    # And a pace (--body-min-rate, --body-rate-grace; Apache mod_reqtimeout's MinRate):
    # ``body_rate_grace`` seconds after the head, then one more second per
    # ``body_min_rate`` bytes received; a body that falls behind gets 408 and the close.
    # 0: no pace, only the total bound.
    body_min_rate: int = 500
    body_rate_grace: float = 10.0
    # Open connections (--max-connections): at it, a new one takes the place of the
    # oldest that holds no request being served (idle between requests, silent since
    # it opened, or its head still incomplete); when every one is serving, it gets 503
    # and the close, except `health_reserve` more that may ask for GET /health.
    max_connections: int = 1024
    health_reserve: int = 16
    # Open connections from one client address (--max-connections-per-client; 0: no
    # cap), the same way: its own oldest that serves nothing makes room, else 503.
    # Loopback and UNIX socket clients are one address for every client of a proxy on
    # the same host (nginx, HAProxy): only the total cap counts for them, unless
    # ``per_client_loopback``.
    max_per_client: int = 256
    per_client_loopback: bool = False
    ws_max_message: int = 16 << 20  # --ws-max-message-mib
    # Pipelined bytes read ahead while a response is written (the rest waits in the
    # socket, which is backpressure on the client).
    max_read_ahead: int = 1 << 20
