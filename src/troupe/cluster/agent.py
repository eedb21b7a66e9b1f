"""HAProxy's agent check: each node tells the balancer, per model, what it can take.

`troupe cluster render` gives every server line an ``agent-check`` on the node's agent
port and ``weight 100``; HAProxy connects every ``agent-inter``, sends the line's
``agent-send`` and reads one line back (its agent protocol, HAProxy 2.6's configuration
manual, "agent-check"). ``troupe_any``'s lines send an empty line. A model's backend
(``balance first``, in placement order) has its home's line, then each other node twice:
a *warm* line (``MODEL<TAB>warm``), usable only while the model is loaded there, then,
after every warm line, a *cold* line (``MODEL<TAB>cold``, server name ``nX-cold``),
usable only while it is not. So the overflow of a full home goes to a node where the
model is loaded with a slot free before any cold load, from what each node says of
itself alone: a warm node that dies leaves the cold lines usable (no window in which
no server is).

The answers:

- ``N% maxconn:S`` for a usable line: ``S`` is the model's slots (its child's
  ``--parallel``), so HAProxy sends that node at most ``S`` of the model's requests and
  holds the rest in its own queue (visible there) or spills them to the next line,
  instead of a static ``maxconn`` that let requests wait unseen inside troupe; ``N`` is
  the share of slots free (at least 1: ``balance first`` only tells 0 from the rest);
- ``0%``: the line takes no new request (those under way go on): the other line of
  that node is the one in use, or the model is being stopped or swapped out there (unless
  no other node of its order answers ``/health`` now: its requests then wait there, as
  on one node), or the node is shutting down. A model whose child is started again on a
  narrower CPU lane (a re-plan, beside a newcomer) keeps its line: it is back within a
  load from the page cache, and a cold load elsewhere would cost as much and evict there.

HAProxy asks each line on its own clock, so a node's two lines would change over at
different moments: a cold line told ``0%`` as the model starts loading while its warm
line still holds the ``0%`` it was told before would leave the node with no usable line
(and, with every node changing over, the model with no server: a burst of 503s). The
agent hands over instead: a line steps back only once its node's other line has been
told it is usable, so a change of line overlaps (both lead to the same node) and never
leaves a gap. (With two balancers asking one agent, the hand-over is per agent, not per
balancer: a gap of one check at most.)

The agent never answers ``ready``, ``drain`` or ``maint``: those set the administrative
state an operator sets on the runtime API (``set server ... state drain``), which the
agent would undo every second.
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
PEER_WITHIN = 0.5  # seconds another node has to answer /health (within HAProxy's 2 s)
MAX_QUERY = 512


def agent_reply(
    model: str,
    view: ModelView | None,
    *,
    leaving: bool,
    role: str = "",
    alone: bool = False,
    other_told: bool = True,
) -> str:
    """One agent answer (a line, newline included) for ``model``'s line of ``role``
    ("": the home's, "warm", "cold") on this node; ``alone``: no other node up can
    serve the model; ``other_told``: this node's other line for the model was last told
    it is usable (until it has been, this one stays usable: the hand-over)."""
    if leaving:
        return "0%\n"
    if not model or view is None:
        return "100%\n"
    if _leaving_here(view) and not alone:
        return "0%\n"
    slots = max(1, view.slots or DEFAULT_SLOTS)
    if view.api_status.is_running:
        if role == "cold" and other_told:
            return "0%\n"  # its warm line serves it
        free = max(0, slots - view.in_flight)
        weight = max(1, round(100 * free / slots)) if not view.waiting else 1
        return f"{weight}% maxconn:{slots}\n"
    if role == "warm" and other_told:
        return "0%\n"  # not loaded here: its cold line, after every warm one
    return f"100% maxconn:{slots}\n"


def _leaving_here(view: ModelView) -> bool:
    """The model is being stopped or swapped out on this node, not coming back: a re-plan
    (its child started again on a narrower CPU lane) is back within a load from the page
    cache, sooner than a cold load elsewhere, which would also evict there."""
    return (view.stopping or view.draining_for is not None) and not view.replanning


_OTHER = {"warm": "cold", "cold": "warm"}


class Agent:
    """The agent's listener: one short TCP exchange per check."""

    def __init__(self, cluster: Cluster, snapshot: Callable[[], Snapshot]) -> None:
        self._cluster = cluster
        self._snapshot = snapshot
        # (model, role) -> whether that line was last told it is usable: the hand-over
        # between a node's warm and cold lines (bounded: two per model in the catalog)
        self._told: dict[tuple[str, str], bool] = {}

    async def answer(self, query: str) -> str:
        """The answer to one agent line: ``MODEL``, ``MODEL<TAB>ROLE``, or empty."""
        cluster = self._cluster
        model, _, role = query.partition("\t")
        if cluster.leaving or not model:
            return agent_reply(model, None, leaving=cluster.leaving)
        view = self._snapshot().models.get(model)
        alone = False
        if view is not None and _leaving_here(view):
            # Whether another node of the model's order is alive, asked now: this node's
            # own marks (`Peer.down`) come from its forwards, and the balancer sends it
            # none for a node that died (a drain here at 0% would leave no server).
            order = (await cluster.placement()).order(model)
            alone = True
            for url in order:
                if url == cluster.self_url or cluster.peer(url).down:
                    continue
                if await cluster.peer(url).answers_health(PEER_WITHIN):
                    alone = False
                    break
        other = _OTHER.get(role)
        told = self._told.get((model, other), False) if other else True
        reply = agent_reply(model, view, leaving=False, role=role, alone=alone, other_told=told)
        if other and view is not None:
            self._told[(model, role)] = not reply.startswith("0%")
        return reply

    async def _one(self, stream: trio.SocketStream) -> None:
        async with stream:
            data = b""
            with trio.move_on_after(READ_WITHIN):
                while b"\n" not in data and len(data) < MAX_QUERY:
                    chunk = await stream.receive_some(MAX_QUERY)
                    if not chunk:
                        break
                    data += chunk
            query = data.split(b"\n", 1)[0].strip(b" \r").decode("utf-8", "replace")
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
