"""Trust between the nodes of a cluster: the forward mark, signed with a cluster secret.

A request marked ``x-troupe-forwarded`` is served where it lands, never forwarded again
(the balancer routed it by model, or a node forwarded it). Unsigned, any client could
mark its own request and make a node load a model it is not the home of. With a
cluster secret (separate from users' keys: ``TROUPE_CLUSTER_SECRET`` in the
environment, or ``--cluster-secret-file``; never on the command line), every mark is
checked at the head and a mark that does not verify is refused (401):

- a node's mark: ``SENDER;t=UNIX;s=HEX``, HMAC-SHA256 over the sender, the time and the
  request line, good for `MARK_WINDOW` seconds either side of the receiver's clock (a
  captured mark is good for that request line only, and not for long);
- the balancer's mark: ``balancer;k=TOKEN``, a fixed token derived from the secret that
  `troupe cluster render` writes into HAProxy's configuration (HAProxy deletes any mark a
  client sent before it sets its own; the token never reaches a client).

Without a secret the mark is trusted as before, and the node says so at start.

The node-to-node routes (a conversation's KV slot file pushed to or fetched from a peer,
`troupe.cluster.kvsync`) take only a node's own mark, never the balancer's (HAProxy marks
whatever a client sends through it) and never without a secret; a node's answer on them
carries a `ClusterTrust.seal` over what it sends.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import time
from pathlib import Path

from troupe.errors import UsageError

__all__ = ["MARK_WINDOW", "SECRET_ENV", "ClusterTrust", "read_secret"]

MARK_WINDOW = 300  # seconds a node's signed mark stays good (clock skew included)
SECRET_ENV = "TROUPE_CLUSTER_SECRET"
_BALANCER = b"balancer"


def read_secret(path: str | None, environ: dict[str, str] | None = None) -> bytes | None:
    """The cluster secret: the file ``path`` (its first line), else the environment's
    ``TROUPE_CLUSTER_SECRET``; None when neither is set. UsageError names a file that
    cannot be read or is empty."""
    env = os.environ if environ is None else environ
    if path:
        try:
            text = Path(path).expanduser().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise UsageError(f"cannot read --cluster-secret-file '{path}': {reason}") from None
        lines = text.strip().splitlines()
        secret = lines[0].strip() if lines else ""
        if not secret:
            raise UsageError(f"--cluster-secret-file '{path}' is empty")
        return secret.encode("utf-8")
    value = env.get(SECRET_ENV, "").strip()
    return value.encode("utf-8") if value else None


class ClusterTrust:
    """Makes and checks forward marks (with no secret: plain, and every mark trusted)."""

    __slots__ = ("_secret", "balancer_token")

    def __init__(self, secret: bytes | None) -> None:
        self._secret = secret
        self.balancer_token = (
            hmac.new(secret, b"troupe balancer mark", hashlib.sha256).hexdigest()[:40]
            if secret
            else ""
        )

    @property
    def signed(self) -> bool:
        return self._secret is not None

    def balancer_mark(self) -> str:
        """The value HAProxy sets on every request it routes."""
        return f"balancer;k={self.balancer_token}" if self._secret else "balancer"

    def mark(self, sender: str, method: str, target: str, now: float | None = None) -> bytes:
        """A node's mark on a request it sends to another node."""
        if self._secret is None:
            return sender.encode("latin-1")
        stamp = int(time.time() if now is None else now)
        return f"{sender};t={stamp};s={self._sign(sender, stamp, method, target)}".encode("latin-1")

    def verify(
        self,
        value: str,
        method: str,
        target: str,
        now: float | None = None,
        *,
        node_only: bool = False,
    ) -> bool:
        """Whether the mark ``value`` on request ``method target`` is genuine.
        ``node_only``: only a node's own signed mark (the node-to-node routes: the
        balancer marks whatever a client sends through it), and never without a secret."""
        if self._secret is None:
            return not node_only
        sender, _, rest = value.partition(";")
        fields = dict(part.partition("=")[::2] for part in rest.split(";") if part)
        if sender.encode("latin-1", "replace") == _BALANCER and "k" in fields:
            if node_only:
                return False
            return hmac.compare_digest(fields["k"].encode(), self.balancer_token.encode())
        try:
            stamp = int(fields.get("t", ""))
        except ValueError:
            return False
        if abs((time.time() if now is None else now) - stamp) > MARK_WINDOW:
            return False
        expected = self._sign(sender, stamp, method, target)
        return hmac.compare_digest(fields.get("s", "").encode(), expected.encode())

    def seal(self, *parts: str) -> str:
        """An HMAC over ``parts`` (a node's answer on a node-to-node route: a KV slot
        file's identity, tenant and checksum), "" without a secret."""
        if self._secret is None:
            return ""
        message = "\n".join(("troupe seal", *parts)).encode("utf-8", "replace")
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()

    def sealed(self, value: str, *parts: str) -> bool:
        """Whether ``value`` is `seal` of ``parts`` (never without a secret)."""
        expected = self.seal(*parts)
        return bool(expected) and hmac.compare_digest(value.encode(), expected.encode())

    def _sign(self, sender: str, stamp: int, method: str, target: str) -> str:
        assert self._secret is not None
        message = f"{sender}\n{stamp}\n{method} {target}".encode("latin-1", "replace")
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()
