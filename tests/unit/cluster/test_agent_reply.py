"""The HAProxy agent's answers (`troupe.cluster.agent`) and the server lines that ask
for them, checked by real HAProxy (-c)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import attrs

from troupe.cluster.agent import agent_reply
from troupe.cluster.placement import Placement, node_facts
from troupe.cluster.render import RenderOptions, render_haproxy
from troupe.sched import ModelView, Status


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
