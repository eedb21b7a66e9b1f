"""One request to the session's model: leased for its length, sent over the one transport.

The lease is taken per request (a response, a transcription), never per connection,
through the same pipeline as an HTTP request's (`troupe.lease.Lease`: bounded by
``--queue-timeout``, counted in the queue-wait metric, the KV store's slot). The bytes
go through the relay's pool (keyed by the child's generation); closing an unfinished
answer stops the child's generation at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from troupe.assembly import Troupe
from troupe.lease import Lease
from troupe.proxy.upstream import UpstreamResponse
from troupe.realtime.events import new_id

__all__ = ["ChildCall"]

CLOSE_GRACE = 2.0  # seconds to close a child's answer when the caller is gone


class ChildCall:
    def __init__(
        self, ctx: Troupe, model: str, autoload: bool, api_key: str | None, tenant: str = ""
    ) -> None:
        self.ctx = ctx
        self.tenant = tenant  # whose session it is (`troupe.http.keys.tenant_of`)
        self.model = model
        self.autoload = autoload
        # The session is one conversation: the KV store keeps it on its slot of the
        # child, or restores it there when other conversations took the slot meanwhile.
        self.conversation = new_id("realtime")
        # Children inherit the router's keys; the client's key goes on, as the relay does.
        self._auth = [(b"authorization", f"Bearer {api_key}".encode())] if api_key else []

    async def post(
        self,
        target: str,
        body: bytes,
        content_type: str,
        handle: Callable[[UpstreamResponse], Awaitable[None]],
        held: Callable[[], int | None] | None = None,
        used: Callable[[], int | None] | None = None,
    ) -> None:
        """Lease the model, POST ``body`` to ``target`` and give the answer to ``handle``;
        ``held`` says, once it is handled, how many tokens the child's slot holds (for
        the KV store: a slot too small to keep is later taken without a save); ``used``,
        the tokens the answer counted (prompt + generated; None: unknown), given to the
        release (the tenant's attained service) and to its budget's settlement.

        Raises `ModelUnavailable` (upstream's error) or `UpstreamError`.
        """
        ctx = self.ctx
        lease = Lease(
            ctx, self.model, autoload=self.autoload, tenant=self.tenant,
            conversation=self.conversation, validate=False,  # (validated at the handshake)
            body=body,  # its cost, for a tenant with a token limit
        )  # fmt: skip
        async with lease:
            grant = lease.grant
            headers = [
                (b"host", f"127.0.0.1:{grant.port}".encode()),
                (b"content-type", content_type.encode()),
                *self._auth,
            ]
            async with lease.slot(target, body) as hold:
                sent = body if hold is None else hold.body
                upstream = await ctx.relay.pool.request(grant, "POST", target, headers, sent)
                try:
                    await handle(upstream)
                    if hold is not None and held is not None:
                        hold.tokens = held()
                finally:
                    if used is not None:
                        lease.used = used()
                    with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_GRACE):
                        await upstream.aclose()
