"""A conversation's KV slot file between nodes: the transport of `troupe.kvstore.replicas`.

Two node-to-node routes, taken only with a node's own mark signed with the cluster
secret (`troupe.cluster.trust`; a user's key, the balancer's mark or no secret at all
get the same 401 on both, whatever the KV store holds):

- ``POST /troupe/cluster/kv?model=&ident=&tenant=&sha256=``, the file as its body: a
  push after a save. The signed request line carries the sha256, so the body cannot be
  swapped; the receiver stores the file only if it is a slot file of that sha256.
- ``POST /troupe/cluster/kv/fetch?model=&ident=&tenant=&better=N``, the prompt's tokens
  as ``{"tokens": [...]}``: the receiver answers 200 with its own entry of that tenant
  sharing more than ``N`` of them (``x-troupe-kv-sha256``, and ``x-troupe-kv-seal``: a
  `ClusterTrust.seal` over identity, tenant and sha256, so the answer cannot be
  swapped either), else 404.

`KvLink` is what the KV store's `Replicas` calls: a push goes to the first
``replicas`` nodes of the model's placement order other than this one that are not
down (the node failover and spill go to first); a fetch asks every peer of the order
at once and takes the first file that comes.
"""

from __future__ import annotations

import json
import logging
from urllib.parse import urlencode

import trio

from troupe.cluster.view import Cluster, Peer
from troupe.proxy.upstream import UpstreamError, render_request

__all__ = ["KV_FETCH", "KV_PATH", "KV_SEAL", "KV_SHA256", "KvLink", "seal_parts"]

log = logging.getLogger("troupe.cluster")

KV_PATH = "/troupe/cluster/kv"
KV_FETCH = KV_PATH + "/fetch"
KV_SHA256 = b"x-troupe-kv-sha256"
KV_SEAL = b"x-troupe-kv-seal"
PUSH_RATE = 20 << 20  # bytes a second a push is given, beyond the cluster timeout


def seal_parts(ident: str, tenant: str, sha256: str) -> tuple[str, ...]:
    """What a fetch's answer is sealed over."""
    return ("kv", ident, tenant, sha256)


class KvLink:
    """The KV store's peers (`troupe.kvstore.replicas.KvPeers`) over the cluster."""

    def __init__(self, cluster: Cluster, replicas: int) -> None:
        self.cluster = cluster
        self.replicas = replicas

    async def _peers(self, model: str, count: int | None = None) -> list[Peer]:
        """The model's nodes in order, this one left out (none while it does not know
        which it is), those down skipped; the first ``count``."""
        cluster = self.cluster
        order = (await cluster.placement()).order(model)
        if cluster.self_url is None:
            return []
        peers = [cluster.peer(u) for u in order if u != cluster.self_url]
        up = [p for p in peers if not p.down]
        return up if count is None else up[:count]

    def _wire(self, peer: Peer, target: str, body: bytes, ctype: bytes) -> bytes:
        headers = [(b"host", peer.authority), (b"content-type", ctype)]
        headers += self.cluster.mark("POST", target)
        return render_request("POST", target, headers, body)

    async def push(self, model: str, ident: str, tenant: str, sha256: str, data: bytes) -> None:
        query = urlencode({"model": model, "ident": ident, "tenant": tenant, "sha256": sha256})
        target = f"{KV_PATH}?{query}"
        within = self.cluster.health_within + len(data) / PUSH_RATE
        for peer in await self._peers(model, self.replicas):
            status: int | None = None
            with trio.move_on_after(within):
                try:
                    wire = self._wire(peer, target, data, b"application/octet-stream")
                    status, _ = await _exchange(peer, wire, 1 << 16)
                except UpstreamError as exc:
                    log.info("KV push of %s to %s failed: %s", model, peer.url, exc)
                    continue
            if status is None:
                log.info("KV push of %s to %s took over %.0f s", model, peer.url, within)
            elif status >= 300:
                log.info("KV push of %s to %s: %d", model, peer.url, status)

    async def fetch(
        self, model: str, ident: str, tenant: str, tokens: list[int], better_than: int, limit: int
    ) -> tuple[str, bytes] | None:
        query = {"model": model, "ident": ident, "tenant": tenant, "better": str(better_than)}
        target = f"{KV_FETCH}?{urlencode(query)}"
        body = json.dumps({"tokens": tokens}).encode()
        found: list[tuple[str, bytes]] = []

        async def ask(peer: Peer, nursery: trio.Nursery) -> None:
            try:
                wire = self._wire(peer, target, body, b"application/json")
                status, answer, headers = await _exchange_with_headers(peer, wire, limit)
            except UpstreamError as exc:
                log.debug("KV fetch from %s failed: %s", peer.url, exc)
                return
            sha256 = headers.get(KV_SHA256, "")
            sealed = self.cluster.trust.sealed(
                headers.get(KV_SEAL, ""), *seal_parts(ident, tenant, sha256)
            )
            if status != 200:
                return  # (404: it holds nothing better)
            if not sealed:
                log.warning("KV fetch from %s: an answer without a valid seal", peer.url)
                return
            if not found:
                found.append((sha256, answer))
                nursery.cancel_scope.cancel()  # the first file wins

        async with trio.open_nursery() as nursery:
            for peer in await self._peers(model):
                nursery.start_soon(ask, peer, nursery)
        return found[0] if found else None


async def _exchange(peer: Peer, wire: bytes, limit: int) -> tuple[int, bytes]:
    status, body, _ = await _exchange_with_headers(peer, wire, limit)
    return status, body


async def _exchange_with_headers(
    peer: Peer, wire: bytes, limit: int
) -> tuple[int, bytes, dict[bytes, str]]:
    """One request to ``peer``: its status, body (at most ``limit`` bytes, else
    `UpstreamError`) and headers (lower-case names)."""
    upstream = await peer.send(wire)
    try:
        parts: list[bytes] = []
        size = 0
        async for chunk in upstream.chunks():
            size += len(chunk)
            if size > limit:
                raise UpstreamError(f"an answer over {limit} bytes")
            parts.append(chunk)
    finally:
        upstream.close()
    headers = {k.lower(): v.decode("latin-1") for k, v in upstream.headers}
    return upstream.status_code, b"".join(parts), headers
