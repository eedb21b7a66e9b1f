"""The cluster at the edge: a request that reached a node it should not be served on is
forwarded, once, to the model's node; ``GET /v1/models`` answers for every node.

Only requests without the forward mark are looked at (`troupe.cluster.FORWARDED`): the
balancer marks each request it routed by model, and a node marks each it forwards, so
a request is forwarded at most once and one the balancer placed (its home node, or the
next one under load or in a failover) is served where it landed.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from troupe.assembly import Troupe
from troupe.cluster import FORWARDED, Cluster
from troupe.cluster.render import NODE_HEADER, server_names
from troupe.cluster.view import Hung, Peer
from troupe.http import access
from troupe.http.errors import error_body
from troupe.http.server.exchange import Exchange
from troupe.ops.access import AccessRecord
from troupe.proxy.client import ChildLost, RelayReport
from troupe.proxy.fields import request_headers
from troupe.proxy.upstream import Unreachable, UpstreamError, UpstreamResponse, render_request

__all__ = ["ask_every_peer", "cluster_models", "forward_elsewhere", "stream_elsewhere"]

log = logging.getLogger("troupe.cluster")

CUT_GRACE = 5.0  # seconds a relay cut from its hung node may go without writing (then cut)


def _wire(ex: Exchange, peer: Peer, cluster: Cluster) -> bytes:
    headers = request_headers(ex.headers, peer.port)
    headers[0] = (b"host", peer.authority)
    target = ex.target.decode("latin-1")
    headers += cluster.mark(ex.method, target)
    return render_request(ex.method, target, headers, ex.body)


async def forward_elsewhere(ctx: Troupe, ex: Exchange, name: str) -> bool:
    """True when the request for model ``name`` went to another node (and its answer to
    the client); False when it is to be served here. A node that refuses the connection
    is skipped (nothing of the request reached it) for the next in the model's order; a
    node that took the request and hangs (`Hung`: no answer, no health check answered
    within ``--cluster-timeout``) is left once for the next, since no byte of its
    answer reached the client (a second hung node ends the request with a 504).

    A forward is recorded here too (an access record of kind "forwarded" naming the node
    that served it, ``troupe_forwarded_total`` by node and outcome); the serving node
    records the request as it always does (its tokens, its waits)."""
    cluster = ctx.cluster
    if cluster is None or ex.header(FORWARDED) is not None:
        return False
    order = (await cluster.placement()).order(name)
    names = server_names(cluster.nodes.urls())
    failed_over = False
    record: tuple[AccessRecord, float] | None = None
    try:
        for url in order:
            if url == cluster.self_url:
                return False
            peer = cluster.peer(url)
            if peer.down:
                continue
            to = names.get(url, url)
            if record is None:
                record = access.begin(ctx, ex)
                record[0].kind, record[0].model = "forwarded", name
            try:
                upstream = await cluster.send_watched(peer, _wire(ex, peer, cluster))
            except Unreachable as exc:
                log.warning("node %s unreachable for %s: %s", url, name, exc)
                ctx.metrics.observe_forward(to, "unreachable")
                continue
            except Hung as exc:
                log.warning("node %s hung with a request for %s: %s", url, name, exc)
                ctx.metrics.observe_forward(to, "hung")
                if not failed_over:
                    failed_over = True
                    continue
                message = f"the nodes serving model {name} do not answer ({exc})"
                await ex.respond(504, error_body(message, "unavailable_error"))
                _finish(ctx, ex, record, to, message, client_left=False)
                return True
            except UpstreamError as exc:
                # Some of it may have reached that node: never sent a second time.
                ctx.metrics.observe_forward(to, "failed")
                message = f"the node serving model {name} ({url}) failed: {exc}"
                await ex.respond(500, error_body(message, "server_error"))
                _finish(ctx, ex, record, to, message, client_left=False)
                return True
            report = RelayReport()
            cut, left = await _relay_answer(ctx, ex, upstream, peer, report)
            ctx.metrics.observe_forward(to, "cut" if cut else "served")
            why = f"node {to} hung half-way through its answer" if cut else None
            _finish(ctx, ex, record, to, why, client_left=left, report=report)
            record = None
            return True
        return False
    finally:
        if record is not None:  # not forwarded after all (served here, or nowhere)
            ctx.requests.abandon(record[0])


def _finish(
    ctx: Troupe,
    ex: Exchange,
    record: tuple[AccessRecord, float],
    to: str,
    error: str | None,
    *,
    client_left: bool,
    report: RelayReport | None = None,
) -> None:
    """The forwarding node's record: what it relayed to the client (``report``: status,
    bytes, first byte and token, the answer's usage), as a local request's record has."""
    rec, started = record
    rec.node, rec.error = to, error
    access.finish(ctx, ex, rec, started, report, client_left=client_left)


async def _relay_answer(
    ctx: Troupe,
    ex: Exchange,
    upstream: UpstreamResponse,
    peer: Peer | None = None,
    report: RelayReport | None = None,
) -> tuple[bool, bool]:
    """(whether the relay was cut because the node hung, whether the client left);
    ``report`` filled with what was relayed (`Relay.answer`)."""

    hung = ""  # why the answer broke off, once its node stopped answering

    async def why() -> str | None:
        return hung or None

    async def relay() -> None:
        try:
            await ctx.relay.answer(ex, upstream, len(ex.body), report, why)
        except ChildLost:
            ex.keep_alive = False  # the answer is cut short: it must look cut

    cluster = ctx.cluster
    if cluster is None or peer is None:
        return False, await ex.until_client_leaves(relay)
    hung_peer = peer
    cut = False
    # The node that served it, by its server name (the balancer keeps this header and
    # names the node it sent the request to only where no node did).
    served_by = server_names(cluster.nodes.urls()).get(peer.url, peer.url)
    upstream.headers.append((NODE_HEADER, served_by.encode("latin-1")))

    async def watched() -> None:
        nonlocal cut
        # The node may hang half-way through its answer: cut the relay when it stops
        # answering its health check (a stream ends with an error event, a whole answer
        # short).
        async with trio.open_nursery() as nursery:

            async def until_hung() -> None:
                nonlocal cut, hung
                await cluster.watch_relay(hung_peer)
                log.warning("node %s hung half-way through an answer: cut", hung_peer.url)
                cut = True
                within = cluster.health_within
                hung = f"node {served_by} stopped answering (no health check within {within:g} s)"
                ex.keep_alive = False
                # The relay's read ends as on a broken connection: a stream gets its final
                # error event (at a chunk boundary), a whole answer ends short.
                upstream.abort()
                # The relay writes what it holds, then the event; a client still reading
                # (slowly: a backlog of thousands of events) gets it, one that took
                # nothing for CUT_GRACE is cut (its relay cancelled).
                while True:
                    sent = report.bytes_out if report is not None else -1
                    await trio.sleep(CUT_GRACE)
                    if report is None or report.bytes_out == sent:
                        break
                nursery.cancel_scope.cancel()

            nursery.start_soon(until_hung)
            await relay()
            nursery.cancel_scope.cancel()

    # A client that goes away closes the connection to the peer: it stops generating.
    left = await ex.until_client_leaves(watched)
    return cut, left


async def cluster_models(ctx: Troupe, ex: Exchange, local: dict[str, Any]) -> Any:
    """``GET /models``: a peer asking (the forward mark) gets this node's own list and
    id; a client gets the union of every node's."""
    cluster = ctx.cluster
    if cluster is None:
        return local
    if ex.header(FORWARDED) is not None:
        # Its HAProxy agent's port, for `troupe cluster render` (None: no agent).
        return {**local, "troupe": {"node": cluster.node_id, "agent_port": cluster.agent_port}}
    return cluster.union(local, await cluster.docs(fresh=True))


async def stream_elsewhere(ctx: Troupe, ex: Exchange) -> bool:
    """``GET /v1/stream?conv_id=`` for a conversation this node does not hold: asked of
    each other node in turn (a GET changes nothing); the first that does not answer
    404 is relayed. False when none holds it."""
    cluster = ctx.cluster
    if cluster is None or ex.header(FORWARDED) is not None:
        return False
    await cluster.docs()  # learns which URL is this node
    for url in cluster.nodes.urls():
        peer = cluster.peer(url)
        if url == cluster.self_url or peer.down:
            continue
        try:
            upstream = await peer.send(_wire(ex, peer, cluster))
        except UpstreamError as exc:
            log.warning("node %s: %s %s failed: %s", url, ex.method, ex.path, exc)
            continue
        if upstream.status_code == 404:
            upstream.close()
            continue
        await _relay_answer(ctx, ex, upstream)
        return True
    return False


async def ask_every_peer(ctx: Troupe, ex: Exchange, within: float) -> list[bytes]:
    """The request, with the forward mark, to every other node at once; the bodies of
    the 200 answers that came within ``within`` seconds (stream lookups and deletes)."""
    cluster = ctx.cluster
    if cluster is None or ex.header(FORWARDED) is not None:
        return []
    await cluster.docs()
    answers: list[bytes] = []

    async def one(peer: Peer) -> None:
        with trio.move_on_after(within):
            try:
                upstream = await peer.send(_wire(ex, peer, cluster))
                try:
                    body = b"".join([chunk async for chunk in upstream.chunks()])
                finally:
                    upstream.close()
            except UpstreamError:
                return
            if upstream.status_code == 200:
                answers.append(body)

    async with trio.open_nursery() as nursery:
        for url in cluster.nodes.urls():
            if url != cluster.self_url and not cluster.peer(url).down:
                nursery.start_soon(one, cluster.peer(url))
    return answers
