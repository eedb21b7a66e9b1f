"""HAProxy's agent check: each node tells the balancer, per model, what it can take.

`troupe cluster render` gives every server line of a model's backend an ``agent-check``
on this node's agent port with ``agent-send "MODEL\\n"`` (the ``troupe_any`` lines send
an empty line). HAProxy connects every ``agent-inter``, sends that line and reads one
line back (its agent protocol, HAProxy 2.6's configuration manual, "agent-check"):

- ``ready N% maxconn:S``: the model's child serves ``S`` requests at once (its slots,
  ``--parallel``), so HAProxy sends this node at most ``S`` of that model's requests and
  holds the rest in its own queue (visible there) or spills them to the next node,
  instead of a static ``maxconn`` that let requests wait unseen inside troupe; the
  weight is the share of slots free (at least 1%);
- ``drain``: no new request (sessions under way go on) while the model is being
  stopped or swapped out here, or the node is shutting down; and on a node where the
  model is not loaded (and which is not its home) while another node has it loaded
  with a slot free: the spill goes to that warm copy rather than a cold load here.

The answer is worked out from this node's snapshot and the peers' last ``/models``
(`agent_reply` is pure); no request waits on it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from troupe.cluster.view import Cluster
from troupe.sched import ModelView, Snapshot

__all__ = ["DEFAULT_SLOTS", "Agent", "agent_reply"]

log = logging.getLogger("troupe.cluster")

DEFAULT_SLOTS = 4  # llama-server's --parallel auto, for a model whose child never ran
READ_WITHIN = 2.0  # seconds HAProxy has to send its line
MAX_QUERY = 512


def agent_reply(
    model: str, view: ModelView | None, *, leaving: bool, home: bool, warm_elsewhere: bool
) -> str:
    """One agent answer (a line, newline included) for ``model`` on this node."""
    if leaving:
        return "drain\n"
    if not model or view is None:
        return "ready\n"
    if view.stopping or view.draining_for is not None:
        return "drain\n"
    slots = max(1, view.slots or DEFAULT_SLOTS)
    if view.status.is_running:
        free = max(0, slots - view.in_flight)
        weight = max(1, round(100 * free / slots)) if not view.waiting else 1
        return f"ready {weight}% maxconn:{slots}\n"
    if warm_elsewhere and not home:
        return "drain\n"  # a cold load here while a warm copy has room: the copy first
    return f"ready 100% maxconn:{slots}\n"


class Agent:
    """The agent's listener: one short TCP exchange per check."""

    def __init__(self, cluster: Cluster, snapshot: Callable[[], Snapshot]) -> None:
        self._cluster = cluster
        self._snapshot = snapshot

    async def answer(self, query: str) -> str:
        cluster = self._cluster
        if cluster.leaving or not query:
            return agent_reply(
                query, None, leaving=cluster.leaving, home=False, warm_elsewhere=False
            )
        view = self._snapshot().models.get(query)
        home = warm = False
        if view is not None and not view.status.is_running:
            order = (await cluster.placement()).order(query)
            home = bool(order) and order[0] == cluster.self_url
            warm = cluster.warm_elsewhere(query)
        return agent_reply(query, view, leaving=False, home=home, warm_elsewhere=warm)

    async def _one(self, stream: trio.SocketStream) -> None:
        async with stream:
            data = b""
            with trio.move_on_after(READ_WITHIN):
                while b"\n" not in data and len(data) < MAX_QUERY:
                    chunk = await stream.receive_some(MAX_QUERY)
                    if not chunk:
                        break
                    data += chunk
            query = data.split(b"\n", 1)[0].strip().decode("utf-8", "replace")
            try:
                reply = await self.answer(query)
                with trio.move_on_after(READ_WITHIN):
                    await stream.send_all(reply.encode())
            except trio.BrokenResourceError:
                pass

    async def serve(
        self, host: str, port: int, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listens on ``host:port`` (0: any free port); reports the port bound."""
        listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()[1]
        self._cluster.agent_port = bound
        log.info("HAProxy agent on %s:%d", host, bound)
        async with trio.open_nursery() as nursery:
            task_status.started(bound)
            await trio.serve_listeners(self._one, listeners, handler_nursery=nursery)
