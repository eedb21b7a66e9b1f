"""Which node serves a model: pure, no I/O, the same answer on every node and in the
balancer's configuration (`troupe cluster render` writes it out).

A model may go to a node whose catalog has it (by name or alias) and whose memory
can hold it (its ``/models`` entry is not RED). Among those, nodes are ranked by
rendezvous hashing (highest random weight): each (node, model) pair gets a score from
a hash, highest first. Homes are then bounded: taking the models in the order of their
own hash, each gets the first node of its ranking that is home to fewer than its share
(``ceil(models / nodes)``), so six models on three nodes are two on each rather than
whatever the hash gives (three on one node with ``--models-max 2`` would swap). The home
comes first in a model's order. Second choices are bounded the same way: the models
homed on one node get their second node spread over the others (each takes at most
``ceil(k / (nodes - 1))`` of that node's ``k``), so when a node dies no survivor takes
more than its share plus one of the models (before, all of a node's models could share
one second choice: that node swapped a dozen times in seconds while another took none).
The rest of the ranking comes after: where a model spills under load and fails over
to. Adding a node moves mostly the models it now scores highest for; nothing depends
on the order the nodes are listed in, so two lists with the same members give the same
placement.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

__all__ = ["NodeFacts", "Placement", "node_facts", "normalise_url", "rank"]


def normalise_url(url: str) -> str:
    """``http(s)://host:port`` without a trailing slash; a bare ``host:port`` gets
    http://."""
    text = url.strip().rstrip("/")
    if "://" not in text:
        text = "http://" + text
    return text


@attrs.frozen
class NodeFacts:
    """What placement needs of one node: the models it can hold, by canonical name, and
    every name (aliases too) that resolves to one of them."""

    url: str
    models: frozenset[str]
    names: Mapping[str, str] = attrs.field(factory=dict)  # name or alias -> canonical


def node_facts(url: str, models_doc: Mapping[str, Any]) -> NodeFacts:
    """A node's facts from its ``GET /models`` answer."""
    models: set[str] = set()
    names: dict[str, str] = {}
    data = models_doc.get("data")
    for item in data if isinstance(data, list) else []:
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            continue
        extras = item.get("troupe")
        memory = extras.get("memory") if isinstance(extras, dict) else None
        if isinstance(memory, dict) and memory.get("feasibility") == "RED":
            continue  # its memory cannot hold this model
        if isinstance(extras, dict) and "download" in extras:
            continue  # still downloading: not servable yet
        name = item["id"]
        models.add(name)
        names[name] = name
        for alias in item.get("aliases") or ():
            if isinstance(alias, str):
                names.setdefault(alias, name)
    return NodeFacts(normalise_url(url), frozenset(models), names)


def _score(url: str, model: str) -> int:
    digest = hashlib.blake2b(f"{url}\n{model}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rank(model: str, urls: Iterable[str]) -> list[str]:
    """``urls`` by their rendezvous score for ``model``, home first."""
    return sorted(urls, key=lambda u: (-_score(u, model), u))


class Placement:
    """Every node's facts, and the order each model goes to them in."""

    def __init__(self, nodes: Sequence[NodeFacts]) -> None:
        self.nodes = tuple(nodes)
        self._homes = _bounded_homes(self.nodes)
        self._seconds = _bounded_seconds(self.nodes, self._homes)

    def canonical(self, name: str) -> str | None:
        """The model ``name`` means on the first node (in list order) that knows it."""
        for node in self.nodes:
            found = node.names.get(name)
            if found is not None:
                return found
        return None

    def order(self, name: str) -> list[str]:
        """The nodes that may serve ``name``, home first; empty when none can."""
        model = self.canonical(name)
        if model is None:
            return []
        ranked = rank(model, [n.url for n in self.nodes if model in n.models])
        home = self._homes.get(model)
        if not home:
            return ranked
        second = self._seconds.get(model)
        first = [home, second] if second else [home]
        return [*first, *(u for u in ranked if u not in first)]

    def homes(self) -> dict[str, str]:
        """Each model -> its home node."""
        return dict(self._homes)

    def models(self) -> dict[str, list[str]]:
        """Every model any node can hold -> its order; names (aliases too) -> model."""
        every = sorted({m for n in self.nodes for m in n.models})
        return {m: self.order(m) for m in every}

    def names(self) -> dict[str, str]:
        """Every name and alias any node answers to -> its canonical model."""
        out: dict[str, str] = {}
        for node in self.nodes:
            for name, model in node.names.items():
                out.setdefault(name, model)
        return out


def _bounded_homes(nodes: Sequence[NodeFacts]) -> dict[str, str]:
    every = sorted({m for n in nodes for m in n.models}, key=lambda m: (_score("", m), m))
    if not every:
        return {}
    share = math.ceil(len(every) / len(nodes))
    homes: dict[str, str] = {}
    count = {n.url: 0 for n in nodes}
    for model in every:
        ranked = rank(model, [n.url for n in nodes if model in n.models])
        home = next((u for u in ranked if count[u] < share), ranked[0])
        homes[model] = home
        count[home] += 1
    return homes


def _bounded_seconds(nodes: Sequence[NodeFacts], homes: Mapping[str, str]) -> dict[str, str]:
    """Each model -> its second node: a node's models spread over the other nodes."""
    seconds: dict[str, str] = {}
    by_home: dict[str, list[str]] = {}
    for model, home in homes.items():
        by_home.setdefault(home, []).append(model)
    others = len(nodes) - 1
    for home, models in by_home.items():
        if others < 1:
            break
        bound = math.ceil(len(models) / others)
        count: dict[str, int] = {}
        for model in sorted(models, key=lambda m: (_score(home, m), m)):
            ranked = rank(model, [n.url for n in nodes if model in n.models and n.url != home])
            if not ranked:
                continue
            second = next((u for u in ranked if count.get(u, 0) < bound), ranked[0])
            seconds[model] = second
            count[second] = count.get(second, 0) + 1
    return seconds
