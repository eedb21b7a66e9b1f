"""Several ``troupe serve`` nodes on loopback behind real HAProxy (Debian's), configured
by ``troupe cluster render`` exactly as a user would.

Each node is its own process with its own free port and state directory; they all read
one node-list file (``--cluster-nodes FILE``), written once every node listens (their
ports are only known then). HAProxy's configuration is rendered from the nodes' own
``/models`` by the real command; its runtime API (a stats socket) says what its health
checks see.
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Collection, Sequence
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

from troupe.cluster import NodeFacts, Placement
from troupe.cluster.trust import SECRET_ENV, ClusterTrust
from troupe_rig.engine_process import free_port
from troupe_rig.process import TroupeProcess, start_troupe
from troupe_rig.reaper import guard

__all__ = ["HAPROXY", "ClusterStack", "Node", "haproxy_command", "open_cluster"]

HAPROXY = Path("/usr/sbin/haproxy")


@attrs.define(eq=False)
class Node:
    name: str  # its server name in HAProxy's configuration (n1, n2, ...)
    args: list[str]
    state_dir: Path
    port: int = 0
    process: TroupeProcess | None = None
    killed: bool = False
    starts: int = 0
    tag: str = ""  # ClusterStack.tag_var's value in its environment (this start's)
    scheme: str = "http"  # https: its listener has TLS (--ssl-cert-file)

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"


# Phases a model stays in until something happens to it (see troupe.sched.phase).
_SETTLED = frozenset({None, "unloaded", "failed", "held", "loaded", "sleeping"})


def _status(item: dict[str, Any]) -> str | None:
    value = item.get("status", {}).get("value")
    return value if isinstance(value, str) else None


async def haproxy_command(socket: Path, command: str) -> str:
    """One command on HAProxy's runtime API, its whole answer."""
    stream = await trio.open_unix_socket(str(socket))
    async with stream:
        await stream.send_all(command.encode() + b"\n")
        out = b""
        while chunk := await stream.receive_some(65536):
            out += chunk
    return out.decode()


@attrs.define(eq=False)
class ClusterStack:
    nodes: list[Node]
    directory: Path
    socket: Path  # HAProxy's runtime API
    models: dict[str, list[str]]  # model -> the node names whose catalog has it
    nursery: trio.Nursery
    node_args: list[str]
    check_interval: str
    maxconn: int  # each model's requests in flight on one node before the next takes more
    # A variable each node runs with, valued "<directory>-<node>-<start>": what a process
    # of that node's start carries in its environment (its children pass it on).
    tag_var: str | None = None
    port: int = 0  # HAProxy's
    config: str = ""  # the rendered haproxy.cfg
    haproxy: trio.Process | None = None  # its master process (master-worker mode)
    # The cluster secret every node and the render share (TROUPE_CLUSTER_SECRET): the
    # forward mark is signed with it, as a user's cluster should run.
    secret: str = attrs.field(factory=lambda: secrets.token_hex(16))
    env: dict[str, str] = attrs.field(factory=dict)  # more of every node's environment
    render_args: list[str] = attrs.field(factory=list)  # more `troupe cluster render` flags

    def own_headers(self, method: str = "GET", target: str = "/models") -> dict[str, str]:
        """A node's own answer to ``method target`` (a signed forward mark: served where
        it lands, not for the cluster)."""
        mark = ClusterTrust(self.secret.encode()).mark("test", method, target)
        return {"x-troupe-forwarded": mark.decode()}

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def nodes_file(self) -> Path:
        return self.directory / "nodes.txt"

    def new_node(self, catalog: Path) -> Node:
        """A node (not started) with ``catalog`` as its models directory."""
        node = Node(
            f"n{len(self.nodes) + 1}",
            [
                "--models-dir",
                str(catalog),
                "--cluster-nodes",
                str(self.nodes_file),
                # A port of its own that it keeps across restarts: the balancer's
                # configuration names it (the agent's answers stay with the node).
                "--cluster-agent-port",
                str(free_port()),
                *self.node_args,
            ],
            self.directory / f"state{len(self.nodes) + 1}",
        )
        self.nodes.append(node)
        for path in sorted(catalog.glob("*.gguf")):
            self.models.setdefault(path.stem, []).append(node.name)
        return node

    def write_nodes(self) -> None:
        """The node list every node reads: one line per node."""
        self.nodes_file.write_text("".join(n.url + "\n" for n in self.nodes))

    async def render(self) -> None:
        """``troupe cluster render`` into haproxy.cfg."""
        self.config = await trio.to_thread.run_sync(
            render,
            self.nodes_file,
            self.port,
            self.socket,
            self.check_interval,
            self.maxconn,
            self.secret,
            self.render_args,
        )
        (self.directory / "haproxy.cfg").write_text(self.config)

    async def reload(self) -> None:
        """A graceful reload: the master starts new workers on the new configuration;
        the old ones finish the connections they have."""
        assert self.haproxy is not None
        await self.render()
        self.haproxy.send_signal(signal.SIGUSR2)

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def models_of(self, node: Node) -> list[str]:
        """The models in ``node``'s catalog."""
        return sorted(m for m, on in self.models.items() if node.name in on)

    def order(self, model: str) -> list[Node]:
        """The nodes for ``model``, home first: troupe's placement, over the catalogs
        this rig gave the nodes."""
        facts = []
        for node in self.nodes:
            held = frozenset(m for m, on in self.models.items() if node.name in on)
            facts.append(NodeFacts(node.url, held, {m: m for m in held}))
        by_url = {n.url: n for n in self.nodes}
        return [by_url[u] for u in Placement(facts).order(model)]

    async def own_models(self, node: Node) -> dict[str, dict[str, Any]]:
        """The node's own ``/models`` (the forward mark: not the cluster's union)."""
        async with httpx.AsyncClient(timeout=10) as http:
            resp = await http.get(node.url + "/models", headers=self.own_headers())
        return {m["id"]: m for m in resp.json()["data"]}

    async def loaded_on(self, model: str, skip: Collection[str] = ()) -> list[str]:
        """The live nodes with ``model`` loaded, once no node is moving it (a child
        beside a newcomer is restarted on a narrower CPU lane: unloaded for a moment);
        ``skip``: nodes not to ask (a stopped one would not answer)."""
        views = await self.settled(model, skip=skip)
        return [name for name, item in views.items() if _status(item) == "loaded"]

    async def settled(
        self, model: str | None = None, within: float = 30, skip: Collection[str] = ()
    ) -> dict[str, Any]:
        """Each live node's ``/models`` item for ``model`` (or every node's whole list),
        asked again until none is between phases. The nodes publish no event across
        the cluster to wait on; each answer is a fresh read of its state."""
        with trio.fail_after(within):
            while True:
                views: dict[str, Any] = {}
                for node in self.nodes:
                    if node.name in skip:
                        continue
                    if not node.killed and node.process is not None:
                        models = await self.own_models(node)
                        views[node.name] = models.get(model, {}) if model else models
                items = views.values() if model else [i for v in views.values() for i in v.values()]
                if all(item.get("troupe", {}).get("phase") in _SETTLED for item in items):
                    return views
                await trio.sleep(0.05)

    async def server_status(self, name: str) -> str:
        """HAProxy's health-check view of node ``name`` (UP, DOWN, ...)."""
        text = await haproxy_command(self.socket, "show stat")
        rows = csv.DictReader(io.StringIO(text.removeprefix("# ")))
        for row in rows:
            if row.get("pxname") == "troupe_any" and row.get("svname") == name:
                return row.get("status", "")
        return ""  # not in this configuration (yet: a reload is under way)

    async def routed(self, model: str) -> int:
        """How many requests HAProxy has sent to ``model``'s own backend (it read the
        model of each), from its runtime API."""
        text = await haproxy_command(self.socket, "show stat")
        rows = csv.DictReader(io.StringIO(text.removeprefix("# ")))
        for row in rows:
            name = row.get("pxname", "")
            if row.get("svname") == "BACKEND" and name.split("_", 1)[-1] == model:
                return int(row.get("stot") or 0)
        raise KeyError(f"no backend for {model}")

    async def line(self, model: str, server: str) -> dict[str, str]:
        """HAProxy's ``show stat`` row of ``server``'s line in ``model``'s backend."""
        text = await haproxy_command(self.socket, "show stat")
        rows = csv.DictReader(io.StringIO(text.removeprefix("# ")))
        for row in rows:
            name = row.get("pxname", "")
            if row.get("svname") == server and name.split("_", 1)[-1] == model:
                return dict(row)
        raise KeyError(f"no line {server} for {model}")

    async def until_free(self, model: str, node: Node, within: float = 30) -> None:
        """Until ``node`` serves none of ``model``'s requests, as troupe counts them and as
        HAProxy does (a client that left is seen by each a moment later)."""
        # Neither publishes an event across processes; each is asked until both agree.
        with trio.fail_after(within):
            while True:
                mine = (await self.own_models(node)).get(model, {}).get("troupe", {})
                if not mine.get("in_flight") and (await self.line(model, node.name))["scur"] == "0":
                    return
                await trio.sleep(0.05)

    async def wait_status(self, name: str, prefix: str, within: float = 30) -> None:
        # HAProxy has no event to wait on; its runtime API is asked until it agrees.
        with trio.fail_after(within):
            while True:
                try:
                    if (await self.server_status(name)).startswith(prefix):
                        return
                except OSError:
                    pass  # its socket is not there yet
                await trio.sleep(0.05)

    @contextlib.asynccontextmanager
    async def landing_on(self, node: Node) -> AsyncIterator[None]:
        """Inside the block, a request HAProxy cannot route by model lands on ``node``:
        every other node is drained in ``troupe_any`` (its runtime API, as an operator
        would before maintenance; a drained server takes no new request)."""
        others = [n for n in self.nodes if n is not node]
        for other in others:
            await haproxy_command(self.socket, f"set server troupe_any/{other.name} state drain")
        try:
            yield
        finally:
            with trio.CancelScope(shield=True):
                for other in others:
                    command = f"set server troupe_any/{other.name} state ready"
                    await haproxy_command(self.socket, command)

    async def kill(self, node: Node) -> None:
        assert node.process is not None
        node.process.process.kill()  # SIGKILL: no drain, no stop ladder
        node.killed = True
        await node.process.process.wait()

    async def start(self, node: Node) -> None:
        """Start (or start again, on its old port) the node."""
        node.starts += 1
        env = {SECRET_ENV: self.secret, **self.env}
        if self.tag_var is not None:
            node.tag = f"{self.directory.name}-{os.getpid()}-{node.name}-{node.starts}"
            env[self.tag_var] = node.tag
        node.process = await start_troupe(
            node.args, state_dir=node.state_dir, port=node.port, env=env
        )
        node.port = int(node.process.url.rsplit(":", 1)[1])
        node.scheme = node.process.url.split("://", 1)[0]
        node.killed = False
        self.nursery.start_soon(_drain, node.process)


async def _drain(process: TroupeProcess) -> None:
    """Its stderr read to the end (it never blocks on a full pipe), then closed."""
    await process.drain_log()
    assert process.process.stderr is not None
    await process.process.stderr.aclose()


async def _stop(process: trio.Process, grace: float = 20, group: bool = False) -> None:
    """SIGTERM, then SIGKILL (to its process group: HAProxy's workers too)."""
    with trio.CancelScope(shield=True):
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            with trio.move_on_after(grace):
                await process.wait()
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    if group:
                        os.killpg(process.pid, signal.SIGKILL)
                    else:
                        process.kill()
                await process.wait()


def render(
    nodes_file: Path,
    port: int,
    socket: Path,
    check_interval: str,
    maxconn: int,
    secret: str,
    more: Sequence[str] = (),
) -> str:
    """``troupe cluster render`` as a user runs it (the secret in its environment)."""
    argv = [sys.executable, "-m", "troupe", "cluster", "render", "--nodes", str(nodes_file)]
    argv += ["--bind", f"127.0.0.1:{port}", "--check-interval", check_interval]
    argv += ["--stats-socket", str(socket), "--maxconn-per-model", str(maxconn)]
    argv += more
    env = {**os.environ, SECRET_ENV: secret}
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"troupe cluster render failed: {done.stderr}")
    return done.stdout


@contextlib.asynccontextmanager
async def open_cluster(
    directory: Path,
    catalogs: Sequence[Path],
    args: Sequence[str] = (),
    *,
    haproxy: Path = HAPROXY,
    check_interval: str = "300ms",
    maxconn: int = 8,
    tag_var: str | None = None,
    env: dict[str, str] | None = None,
    render_args: Sequence[str] = (),
) -> AsyncIterator[ClusterStack]:
    """A node per models directory in ``catalogs`` (each with ``args``), HAProxy in
    front; everything stopped when the block ends."""
    directory.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (before anything runs)
    (directory / "nodes.txt").write_text("")
    sockets = Path(tempfile.mkdtemp(prefix="hap", dir="/tmp"))  # a unix path is short
    socket = sockets / "api.sock"
    try:
        async with trio.open_nursery() as nursery:
            stack = ClusterStack(
                [], directory, socket, {}, nursery, list(args), check_interval, maxconn, tag_var
            )
            stack.env.update(env or {})
            stack.render_args += render_args
            try:
                for catalog in catalogs:
                    await stack.start(stack.new_node(catalog))
                stack.write_nodes()
                stack.port = free_port()
                await stack.render()
                with (directory / "haproxy.log").open("wb") as hap_log:
                    stack.haproxy = await trio.lowlevel.open_process(
                        [str(haproxy), "-W", "-db", "-f", str(directory / "haproxy.cfg")],
                        stdin=subprocess.DEVNULL,
                        stdout=hap_log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                guard(stack.haproxy.pid)  # its workers too, if this process dies
                for node in stack.nodes:
                    await stack.wait_status(node.name, "UP")
                yield stack
            finally:
                with trio.CancelScope(shield=True):
                    if stack.haproxy is not None:
                        await _stop(stack.haproxy, 5, group=True)
                    async with trio.open_nursery() as stopping:
                        for node in stack.nodes:
                            if node.process is not None:
                                stopping.start_soon(_stop, node.process.process)
                nursery.cancel_scope.cancel()
    finally:
        shutil.rmtree(sockets, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket)
