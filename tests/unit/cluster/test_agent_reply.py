"""The HAProxy agent's answers (`troupe.cluster.agent`) and the server lines that ask
for them, checked by real HAProxy (-c)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import attrs
import trio

from troupe.cluster.agent import Agent, agent_reply
from troupe.cluster.nodes import NodeList
from troupe.cluster.placement import Placement, node_facts
from troupe.cluster.render import RenderOptions, render_haproxy
from troupe.cluster.view import Cluster
from troupe.sched import ModelView, Snapshot, Status, StopCause, StopReason


def _view(status: Status, **changes: object) -> ModelView:
    view = ModelView(
        name="m",
        status=status,
        port=1,
        pid=1,
        exit_code=0,
        failed=False,
        stopping=False,
        progress=None,
        loaded_info=None,
        in_flight=0,
        waiting=0,
        queue_position=None,
        last_used=0.0,
        last_load_seconds=None,
        last_stop=None,
        last_error=None,
        held_until=None,
        pin=False,
        ttl=None,
        slots=4,
    )
    return attrs.evolve(view, **changes)  # type: ignore[arg-type]


def _reply(view: ModelView | None, role: str = "", *, leaving: bool = False) -> str:
    return agent_reply("m", view, leaving=leaving, role=role)


def test_a_loaded_model_offers_its_slots_and_its_free_share() -> None:
    assert _reply(_view(Status.LOADED)) == "100% maxconn:4\n"
    assert _reply(_view(Status.LOADED, in_flight=3)) == "25% maxconn:4\n"
    assert _reply(_view(Status.LOADED, in_flight=4)) == "1% maxconn:4\n"
    assert _reply(_view(Status.LOADED, in_flight=1, waiting=2)) == "1% maxconn:4\n"
    assert _reply(_view(Status.LOADED, slots=1)) == "100% maxconn:1\n"


def test_weight_zero_while_stopping_swapped_out_or_the_node_leaves() -> None:
    assert _reply(_view(Status.LOADED, stopping=True)) == "0%\n"
    assert _reply(_view(Status.LOADED, draining_for="other")) == "0%\n"
    assert _reply(_view(Status.LOADED), leaving=True) == "0%\n"
    assert agent_reply("", None, leaving=True) == "0%\n"
    assert agent_reply("", None, leaving=False) == "100%\n"
    # No other node can serve it: its requests wait here for it, as on one node.
    alone = agent_reply("m", _view(Status.LOADED, stopping=True), leaving=False, alone=True)
    assert alone == "100% maxconn:4\n"


def test_a_replan_keeps_the_line_its_drain_does_not() -> None:
    # A child started again on a narrower CPU lane beside a newcomer is back within a
    # load: its requests wait here, not for a cold load on another node.
    replan = StopCause(StopReason.REPLAN, "other")
    stopping = _view(
        Status.LOADED, stopping=True, last_stop=replan, draining_for="other", replanning=True
    )
    assert _reply(stopping) == "100% maxconn:4\n"
    assert _reply(stopping, "warm") == "100% maxconn:4\n"
    assert _reply(stopping, "cold") == "0%\n"
    coming = _view(Status.UNLOADED, restarting=True, replanning=True, last_stop=replan)
    assert _reply(coming, "warm") == "100% maxconn:4\n"
    assert _reply(coming, "cold") == "0%\n"
    # Its drain waits for requests that may last long: the line steps back meanwhile.
    draining = _view(Status.LOADED, in_flight=1, draining_for="other")
    assert _reply(draining) == "0%\n"
    # Any other stop (a swap, an unload) gives the line up.
    swapped = _view(Status.LOADED, stopping=True, last_stop=StopCause(StopReason.LRU, "x"))
    assert _reply(swapped) == "0%\n"


def test_a_node_warm_line_while_loaded_and_its_cold_line_while_not() -> None:
    loaded, cold = _view(Status.LOADED, in_flight=2), _view(Status.UNLOADED)
    assert _reply(loaded, "warm") == "50% maxconn:4\n"
    assert _reply(loaded, "cold") == "0%\n"
    assert _reply(cold, "warm") == "0%\n"
    assert _reply(cold, "cold") == "100% maxconn:4\n"
    assert _reply(cold) == "100% maxconn:4\n"  # the home's line: it loads there


def test_server_lines_ask_each_node_agent_about_their_model(
    haproxy_path: Path, tmp_path: Path
) -> None:
    urls = ["http://127.0.0.1:18001", "http://127.0.0.1:18002"]
    doc = {"data": [{"id": "a"}, {"id": 'we"ird'}]}
    placement = Placement([node_facts(u, doc) for u in urls])
    agents = {urls[0]: 19001, urls[1]: 19002}
    text = render_haproxy(urls, placement, RenderOptions(agent_inter="500ms"), "", agents)
    config = tmp_path / "haproxy.cfg"
    config.write_text(text)
    checked = subprocess.run(
        [str(haproxy_path), "-c", "-f", str(config)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # The home's line asks about the model; each other node's warm line, then (after
    # every warm line) its cold line, asks about its role.
    names = {u: f"n{i}" for i, u in enumerate(urls, 1)}
    for model in ("a", 'we"ird'):
        home, other = placement.order(model)
        start = text.index(f"  # {model}\n")
        block = text[start : text.find("\n\n", start) if "\n\n" in text[start:] else None]
        servers = [ln.split()[1] for ln in block.splitlines() if ln.startswith("    server ")]
        assert servers == [names[home], names[other], names[other] + "-cold"]
    assert 'agent-inter 500ms agent-send "a\\n"' in text
    assert 'agent-inter 500ms agent-send "a\\twarm\\n"' in text
    assert 'agent-inter 500ms agent-send "a\\tcold\\n"' in text
    assert 'agent-send "we\\"ird\\tcold\\n"' in text
    assert "X-Troupe-Node %[srv_name,field(1,-)]" in text
    any_line = 'check weight 100 agent-check agent-port 19001 agent-inter 500ms agent-send "\\n"'
    assert any_line in text
    # No agent port known (a node that did not say): no agent check on its lines.
    plain = render_haproxy(urls, placement, RenderOptions(), "", {urls[0]: 19001})
    assert "agent-port 19002" not in plain


async def _ask(port: int, line: str) -> str:
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(line.encode() + b"\n")
        data = b""
        while chunk := await stream.receive_some(512):
            data += chunk
    return data.decode()


async def test_a_node_changes_line_by_overlap_never_by_a_gap() -> None:
    """HAProxy asks the warm and the cold line on their own clocks: as the model starts
    loading, the cold line stays usable until the warm line has been told it is; as it
    unloads, the warm line stays usable until the cold line has been told it is. At no
    moment are both of a node's lines at 0% (a gap: no server for the model)."""
    table = {"view": _view(Status.UNLOADED)}

    def snapshot() -> Snapshot:
        return Snapshot(version=1, models={"m": table["view"]}, models_max=4, queue=())

    agent = Agent(Cluster(NodeList("http://127.0.0.1:1")), snapshot)
    told = {"warm": "0%\n", "cold": "0%\n"}

    async def check(role: str) -> str:
        told[role] = await _ask(port, f"m\t{role}")
        assert told != {"warm": "0%\n", "cold": "0%\n"}, "both lines at 0%"
        return told[role]

    async with trio.open_nursery() as nursery:
        port = await nursery.start(agent.serve, "127.0.0.1", 0)
        assert await check("cold") == "100% maxconn:4\n"
        assert await check("warm") == "0%\n"
        table["view"] = _view(Status.LOADING)
        # The cold line is asked first: the warm line still says 0%, so it stays.
        assert await check("cold") == "100% maxconn:4\n"
        assert await check("warm") == "100% maxconn:4\n"
        assert await check("cold") == "0%\n"  # now it steps back
        table["view"] = _view(Status.UNLOADED)
        assert await check("warm") == "100% maxconn:4\n"  # the cold line was told 0%
        assert await check("cold") == "100% maxconn:4\n"
        assert await check("warm") == "0%\n"
        nursery.cancel_scope.cancel()
