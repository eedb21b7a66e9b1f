"""This node's view of the cluster: the peers' ``/models``, fetched when a request needs
them and kept for a moment, and a pool of keep-alive connections to each peer.

A request never waits for the peers but the first time: a request that finds the
copy older than `FRESH_FOR` uses it and wakes the refresher (`Cluster.run`), so a peer
that is slow to answer (a host gone from the network) delays no request. Nothing is
fetched while no request needs it.

Only requests that reach a node without the forward mark pay for this: those the
balancer could not route by model (the body's ``model`` past its buffer, or not JSON)
and ``GET /v1/models``. A node with no ``--cluster-nodes`` has no `Cluster` at all.
Which URL in the list is this node is learnt from the answers: each node's ``/models``
carries its random id, and the URL that answers with ours is us. Its name (the ``node``
label of its ``/metrics`` and ``/models/sse``) is the server name `troupe cluster
render` gives that URL: ``n1``, ``n2``, ... by its place in the list.
"""

from __future__ import annotations

import json
import logging
import math
import ssl
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Protocol
from urllib.parse import urlsplit

import trio

from troupe.cluster.nodes import NodeList
from troupe.cluster.placement import Placement, node_facts
from troupe.cluster.render import server_names
from troupe.cluster.trust import ClusterTrust
from troupe.proxy.upstream import (
    ChildRef,
    Unreachable,
    UpstreamError,
    UpstreamPool,
    UpstreamResponse,
    render_request,
)

__all__ = ["COPY_TTL", "FORWARDED", "Cluster", "Copies", "Hung", "Peer"]

log = logging.getLogger("troupe.cluster")

# On a request: it is where it belongs (the balancer routed it by model, or a node
# forwarded it): serve it here, never forward it again. Its value names the sender.
FORWARDED = b"x-troupe-forwarded"
FRESH_FOR = 2.0  # seconds the peers' /models stay good for placement and the union
FETCH_WITHIN = 2.0  # a peer that does not answer /models in this long is skipped
DOWN_FOR = 5.0  # a peer that refused a connection is not tried again for this long
CONNECT_WITHIN = 3.0
UNLISTED = "unlisted"  # the name of a node that has not found itself in the list
COPY_TTL = 300.0  # seconds idle before a copy made by failover or spill is given back
COPIES_EVERY = 10.0  # seconds between looks at this node's copies


class Copies(Protocol):
    """This node's scheduler, as the give-back of copies needs it."""

    def loaded(self) -> Iterable[str]:
        """The models loaded here now."""

    async def keep_alive(self, model: str, seconds: float) -> None:
        """Unload ``model``'s running child after ``seconds`` idle."""


class Hung(UpstreamError):
    """The node took the request and then stopped answering, its health check too (a
    gray failure: a node stopped, swapping, or cut off half-way). No byte of its answer
    had come when this is raised from `Cluster.send_watched`."""


class Peer:
    """One node's address and a pool of connections to it."""

    def __init__(self, url: str, read_timeout: float) -> None:
        parts = urlsplit(url)
        self.url = url
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ref = ChildRef(model=url, gen=0, port=self.port)
        self.authority = f"{self.host}:{self.port}".encode()
        # An https node is reached over TLS, its certificate verified against the
        # system's CAs (OpenSSL's SSL_CERT_FILE / SSL_CERT_DIR name a cluster's own CA).
        tls = ssl.create_default_context() if parts.scheme == "https" else None
        self.pool = UpstreamPool(self.host, CONNECT_WITHIN, read_timeout, tls)
        self.down_until = -math.inf

    async def send(self, wire: bytes) -> UpstreamResponse:
        """One request; `Unreachable` when no connection could be made (nothing left)."""
        try:
            return await self.pool.send(self.ref, wire)
        except Unreachable:
            self.down_until = trio.current_time() + DOWN_FOR
            raise

    @property
    def down(self) -> bool:
        return trio.current_time() < self.down_until

    async def answers_health(self, within: float) -> bool:
        """Whether the node answers ``GET /health`` (any status: it is alive) within
        ``within`` seconds, on a connection of its own."""
        wire = render_request("GET", "/health", [(b"host", self.authority)], b"")
        with trio.move_on_after(within):
            try:
                upstream = await self.pool.send(self.ref, wire)
                try:
                    async for _ in upstream.chunks():
                        pass
                finally:
                    upstream.close()
            except UpstreamError:
                return False
            return True
        return False


class Cluster:
    """The node list, the peers' last ``/models``, and where each model goes."""

    def __init__(
        self,
        nodes: NodeList,
        *,
        api_key: str | None = None,
        read_timeout: float = 3600.0,
        trust: ClusterTrust | None = None,
        health_within: float = 5.0,
    ) -> None:
        self.nodes = nodes
        self.trust = trust or ClusterTrust(None)
        self.health_within = health_within  # --cluster-timeout
        self.node_id = uuid.uuid4().hex
        self.self_url: str | None = None
        self._api_key = api_key
        self._read_timeout = read_timeout
        self._peers: dict[str, Peer] = {}
        self._docs: dict[str, Mapping[str, Any]] = {}  # url -> its last /models
        self._fetched_at = -math.inf
        self._lock = trio.Lock()
        self._wanted = trio.Event()  # a request found the copy stale
        self._placement: Placement | None = None
        self.leaving = False  # shutting down: the HAProxy agent says drain
        self.agent_port: int | None = None  # the HAProxy agent's (cluster.agent), once bound

    def peer(self, url: str) -> Peer:
        found = self._peers.get(url)
        if found is None:
            found = self._peers[url] = Peer(url, self._read_timeout)
        return found

    async def name(self) -> str:
        """This node's name in the cluster (its server name in the balancer's
        configuration), or `UNLISTED` while no URL of the list answered with its id."""
        await self.docs()
        if self.self_url is None:
            return UNLISTED
        return server_names(self.nodes.urls()).get(self.self_url, UNLISTED)

    def mark(self, method: str, target: str) -> list[tuple[bytes, bytes]]:
        """This node's forward mark on the request ``method target`` (signed with the
        cluster secret when there is one: `troupe.cluster.trust`)."""
        return [(FORWARDED, self.trust.mark(self.node_id, method, target))]

    def trusts(self, mark: str, method: str, target: str) -> bool:
        """Whether a request's forward mark is genuine (always, without a secret)."""
        return self.trust.verify(mark, method, target)

    def _auth(self) -> list[tuple[bytes, bytes]]:
        return [(b"authorization", b"Bearer " + self._api_key.encode())] if self._api_key else []

    async def send_watched(self, peer: Peer, wire: bytes) -> UpstreamResponse:
        """`Peer.send`, watched: while no answer has come, the node's health is checked
        every ``health_within`` seconds, and a node that does not answer it is taken
        for hung (`Hung`: it is left out for `DOWN_FOR` and nothing more waits on it).
        A slow answer from a node that is alive (a load, a long prefill) is waited for."""

        async def watch(scope: trio.CancelScope) -> None:
            while True:
                await trio.sleep(self.health_within)
                if not await peer.answers_health(self.health_within):
                    peer.down_until = trio.current_time() + DOWN_FOR
                    scope.cancel()
                    return

        upstream: UpstreamResponse | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch, nursery.cancel_scope)
            upstream = await peer.send(wire)
            nursery.cancel_scope.cancel()
        if upstream is None:  # cancelled by the watch before any answer: connection closed
            within = self.health_within
            raise Hung(f"{peer.url} did not answer its health check within {within:g} s")
        return upstream

    async def watch_relay(self, peer: Peer) -> None:
        """Returns when ``peer`` stops answering its health check (for a relay under
        way: the caller cuts it); runs until cancelled while the node is alive."""
        while True:
            await trio.sleep(self.health_within)
            if not await peer.answers_health(self.health_within):
                peer.down_until = trio.current_time() + DOWN_FOR
                return

    async def give_back(self, copies: Copies, ttl: float = COPY_TTL) -> None:
        """Copies made by failover or spill are given back: a model loaded here whose
        home is another node, up and answering, gets a keep-alive of ``ttl`` seconds
        (the scheduler unloads it once idle that long; a request meanwhile keeps it).
        While its home is down the copy stays as the preset says. Runs beside the HTTP
        server; one look every `COPIES_EVERY` seconds (the peers' lists, fresh)."""
        given: set[str] = set()
        while True:
            await trio.sleep(min(COPIES_EVERY, ttl))
            docs = await self.docs(fresh=True)
            placement = await self.placement()
            loaded = set(copies.loaded())
            given &= loaded  # a copy unloaded and loaded again is a new copy
            for model in sorted(loaded - given):
                order = placement.order(model)
                if self.self_url is None or not order or order[0] == self.self_url:
                    continue
                home = order[0]
                if home in docs and not self.peer(home).down:
                    log.info(
                        "model %s: a copy (home %s is up): given back after %gs idle",
                        model,
                        home,
                        ttl,
                    )
                    await copies.keep_alive(model, ttl)
                    given.add(model)

    # ----- the peers' /models -------------------------------------------------------------

    async def docs(self, *, fresh: bool = False) -> dict[str, Mapping[str, Any]]:
        """Each reachable node's ``/models`` (this one's too), at most `FRESH_FOR` old;
        a node that does not answer keeps its last (so placement does not move while
        the balancer fails its models over) until it leaves the list."""
        if self._fetched_at == -math.inf or (fresh and self._stale()):
            # The first time (nothing to answer from yet), or a listing that must say
            # where each model is loaded now: wait for the peers.
            async with self._lock:
                if self._stale():
                    await self._refresh()
        elif self._stale():
            self._wanted.set()
        return dict(self._docs)

    def _stale(self) -> bool:
        return trio.current_time() - self._fetched_at >= FRESH_FOR

    async def run(self) -> None:
        """The refresher: fetches the peers' ``/models`` again when a request found them
        stale (runs beside the HTTP server)."""
        while True:
            await self._wanted.wait()
            self._wanted = trio.Event()
            async with self._lock:
                if self._stale():
                    await self._refresh()

    async def placement(self) -> Placement:
        """Where each model goes, from the copy of the peers' lists (worked out once per
        copy, not per request)."""
        docs = await self.docs()
        if self._placement is None:
            urls = self.nodes.urls()
            self._placement = Placement([node_facts(u, docs[u]) for u in urls if u in docs])
        return self._placement

    async def _refresh(self) -> None:
        urls = self.nodes.urls()
        for gone in [u for u in self._docs if u not in urls]:
            del self._docs[gone]

        async def one(url: str) -> None:
            doc = await self._fetch_models(self.peer(url))
            if doc is not None:
                self._docs[url] = doc
                node = doc.get("troupe")
                if isinstance(node, dict) and node.get("node") == self.node_id:
                    self.self_url = url

        async with trio.open_nursery() as nursery:
            for url in urls:
                nursery.start_soon(one, url)
        self._fetched_at = trio.current_time()
        self._placement = None

    async def _fetch_models(self, peer: Peer) -> Mapping[str, Any] | None:
        headers = [(b"host", peer.authority), *self._auth(), *self.mark("GET", "/models")]
        wire = render_request("GET", "/models", headers, b"")
        with trio.move_on_after(FETCH_WITHIN):
            try:
                upstream = await peer.send(wire)
                try:
                    body = b"".join([chunk async for chunk in upstream.chunks()])
                finally:
                    upstream.close()
                if upstream.status_code != 200:
                    log.warning("%s: GET /models answered %d", peer.url, upstream.status_code)
                    return None
                doc = json.loads(body)
                return doc if isinstance(doc, dict) else None
            except (UpstreamError, ValueError) as exc:
                log.debug("%s: GET /models failed: %s", peer.url, exc)
                return None
        log.warning("%s: GET /models took over %g s", peer.url, FETCH_WITHIN)
        peer.down_until = trio.current_time() + DOWN_FOR  # not forwarded to meanwhile
        return None

    # ----- the union ----------------------------------------------------------------------

    def union(self, local: Mapping[str, Any], docs: Mapping[str, Mapping[str, Any]]) -> Any:
        """``GET /v1/models`` for the whole cluster: every model once, its entry from the
        first node listing it (this one first), ``troupe.nodes`` saying its status on
        each node, and ``status.value`` "loaded" where any node has it loaded."""
        ordered: list[tuple[str, Mapping[str, Any]]] = [(self.self_url or "", local)]
        ordered += [(u, d) for u, d in docs.items() if u != self.self_url]
        merged: dict[str, dict[str, Any]] = {}
        for url, doc in ordered:
            data = doc.get("data")
            for item in data if isinstance(data, list) else []:
                if not isinstance(item, dict) or not isinstance(item.get("id"), str):
                    continue
                status = item.get("status")
                value = status.get("value") if isinstance(status, dict) else None
                entry = merged.get(item["id"])
                if entry is None:
                    entry = merged[item["id"]] = json.loads(json.dumps(item))
                    extras = entry.setdefault("troupe", {})
                    if isinstance(extras, dict):
                        extras["nodes"] = {}
                nodes = entry.get("troupe", {}).get("nodes")
                if isinstance(nodes, dict):
                    nodes[url or "self"] = value
                if value == "loaded" and isinstance(entry.get("status"), dict):
                    entry["status"]["value"] = "loaded"
        reachable = [u for u, _ in ordered if u]
        missing = [u for u in self.nodes.urls() if u not in docs]
        return {
            "data": [merged[k] for k in sorted(merged, key=str.encode)],
            "object": "list",
            "troupe": {"node": self.node_id, "nodes": reachable, "unreachable": missing},
        }

    async def aclose(self) -> None:
        for peer in self._peers.values():
            await peer.pool.aclose()
