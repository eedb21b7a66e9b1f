"""Placement: which nodes may hold a model, in which order, and what a new node moves."""

from __future__ import annotations

from typing import Any

import pytest

from troupe.cluster.nodes import NodeList, parse_urls
from troupe.cluster.placement import Placement, node_facts, rank
from troupe.errors import UsageError


def _doc(*models: str | tuple[str, str], red: tuple[str, ...] = ()) -> dict[str, Any]:
    data = []
    for model in models:
        name, alias = model if isinstance(model, tuple) else (model, None)
        memory = {"feasibility": "RED" if name in red else "GREEN"}
        data.append({"id": name, "aliases": [alias] if alias else [], "troupe": {"memory": memory}})
    return {"data": data, "object": "list"}


def test_a_model_goes_only_where_the_catalog_has_it_and_memory_holds_it() -> None:
    placement = Placement(
        [
            node_facts("http://a:1", _doc("x", "y", red=("y",))),
            node_facts("http://b:1", _doc("x", "y")),
            node_facts("http://c:1", _doc("z")),
        ]
    )
    assert sorted(placement.order("x")) == ["http://a:1", "http://b:1"]
    assert placement.order("y") == ["http://b:1"]  # a's memory cannot hold it
    assert placement.order("z") == ["http://c:1"]
    assert placement.order("nowhere") == []


def test_an_alias_places_as_its_model() -> None:
    placement = Placement(
        [node_facts("http://a:1", _doc(("x", "ex"))), node_facts("http://b:1", _doc("x"))]
    )
    assert placement.order("ex") == placement.order("x")
    assert placement.names() == {"x": "x", "ex": "x"}


def test_the_order_does_not_depend_on_how_the_nodes_are_listed() -> None:
    urls = [f"http://10.0.0.{i}:8080" for i in range(1, 6)]
    for model in ("a", "b", "gemma", "qwen/7b:Q4_K_M"):
        assert rank(model, urls) == rank(model, list(reversed(urls)))


def test_a_fourth_node_takes_only_the_models_it_now_scores_highest_for() -> None:
    three = [f"http://n{i}:8080" for i in range(1, 4)]
    four = [*three, "http://n4:8080"]
    models = [f"model-{i}" for i in range(400)]
    moved = [m for m in models if rank(m, three)[0] != rank(m, four)[0]]
    assert all(rank(m, four)[0] == "http://n4:8080" for m in moved)
    assert 50 < len(moved) < 150  # about a quarter of them


def test_node_urls_from_a_list_or_a_file(tmp_path: Any) -> None:
    assert parse_urls("127.0.0.1:1, http://h:2/ ,127.0.0.1:1") == (
        "http://127.0.0.1:1",
        "http://h:2",
    )
    assert parse_urls("https://h:1/") == ("https://h:1",)  # TLS to that node
    with pytest.raises(UsageError, match="invalid node URL"):
        parse_urls("ftp://h:1")
    listed = tmp_path / "nodes.txt"
    listed.write_text("")
    nodes = NodeList(str(listed))
    assert nodes.urls() == ()
    listed.write_text("# the cluster\nhttp://a:1\nb:2  # the second\n")
    assert nodes.urls() == ("http://a:1", "http://b:2")  # read again: it changed


def test_homes_are_shared_out_evenly_and_come_first() -> None:
    urls = [f"http://n{i}:8080" for i in range(1, 4)]
    models = [f"m-{i}" for i in range(1, 7)]
    placement = Placement([node_facts(u, _doc(*models)) for u in urls])
    homes = placement.homes()
    assert sorted(homes) == models
    assert sorted(list(homes.values()).count(u) for u in urls) == [2, 2, 2]
    for model in models:
        order = placement.order(model)
        assert order[0] == homes[model]
        assert sorted(order) == urls  # the rest: where it spills and fails over to
    # The same members listed in another order: the same homes.
    again = Placement([node_facts(u, _doc(*models)) for u in reversed(urls)])
    assert again.homes() == homes


@pytest.mark.parametrize(("nodes", "count"), [(3, 3), (3, 6), (4, 8), (4, 12), (5, 7)])
def test_a_dead_nodes_models_are_spread_over_the_others(nodes: int, count: int) -> None:
    # Each model fails over to the second node of its order: whichever node dies, no
    # survivor ends up with more than its share plus one of the models.
    urls = [f"http://n{i}:8080" for i in range(1, nodes + 1)]
    models = [f"model-{i}" for i in range(count)]
    placement = Placement([node_facts(u, _doc(*models)) for u in urls])
    share = -(-count // nodes)
    for dead in urls:
        served = {u: 0 for u in urls if u != dead}
        for model in models:
            order = placement.order(model)
            served[next(u for u in order if u != dead)] += 1
            assert sorted(order) == urls
        assert max(served.values()) <= share + 1, (dead, served)
