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


def _reply(
    view: ModelView | None, *, leaving: bool = False, home: bool = True, warm: bool = False
) -> str:
    return agent_reply("m", view, leaving=leaving, home=home, warm_elsewhere=warm)


def test_a_loaded_model_offers_its_slots_and_its_free_share() -> None:
    assert _reply(_view(Status.LOADED)) == "ready 100% maxconn:4\n"
    assert _reply(_view(Status.LOADED, in_flight=3)) == "ready 25% maxconn:4\n"
    assert _reply(_view(Status.LOADED, in_flight=4)) == "ready 1% maxconn:4\n"
    assert _reply(_view(Status.LOADED, in_flight=1, waiting=2)) == "ready 1% maxconn:4\n"
    assert _reply(_view(Status.LOADED, slots=1)) == "ready 100% maxconn:1\n"


def test_drain_while_stopping_swapped_out_or_the_node_leaves() -> None:
    assert _reply(_view(Status.LOADED, stopping=True)) == "drain\n"
    assert _reply(_view(Status.LOADED, draining_for="other")) == "drain\n"
    assert _reply(_view(Status.LOADED), leaving=True) == "drain\n"
    assert agent_reply("", None, leaving=True, home=False, warm_elsewhere=False) == "drain\n"
    assert agent_reply("", None, leaving=False, home=False, warm_elsewhere=False) == "ready\n"


def test_a_cold_node_stands_aside_for_a_warm_copy_unless_it_is_the_home() -> None:
    cold = _view(Status.UNLOADED)
    assert _reply(cold, home=False, warm=True) == "drain\n"
    assert _reply(cold, home=True, warm=True) == "ready 100% maxconn:4\n"
    assert _reply(cold, home=False, warm=False) == "ready 100% maxconn:4\n"


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
    assert 'agent-port 19001 agent-inter 500ms agent-send "a\\n"' in text
    assert 'agent-port 19002 agent-inter 500ms agent-send "we\\"ird\\n"' in text
    assert 'check agent-check agent-port 19001 agent-inter 500ms agent-send "\\n"' in text
    # No agent port known (a node that did not say): no agent check on its lines.
    plain = render_haproxy(urls, placement, RenderOptions(), "", {urls[0]: 19001})
    assert "agent-port 19002" not in plain
