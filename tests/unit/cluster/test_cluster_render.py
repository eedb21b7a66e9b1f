"""`troupe cluster render`'s HAProxy configuration, checked by real HAProxy (-c)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from troupe.cluster.placement import Placement, node_facts
from troupe.cluster.render import RenderOptions, render_haproxy
from troupe.cluster.trust import ClusterTrust


def _doc(*names: str) -> dict[str, Any]:
    return {"data": [{"id": n, "aliases": [f"{n}-alias"]} for n in names]}


def test_the_rendered_configuration_is_valid_and_routes_each_model_in_its_order(
    haproxy_path: Path, tmp_path: Path
) -> None:
    urls = ["http://127.0.0.1:18001", "http://127.0.0.1:18002", "http://127.0.0.1:18003"]
    placement = Placement(
        [
            node_facts(urls[0], _doc("a", "org/repo:Q4_K_M")),
            node_facts(urls[1], _doc("a", "org/repo:Q4_K_M")),
            node_facts(urls[2], _doc("a")),
        ]
    )
    mark = ClusterTrust(b"s3cret").balancer_mark()
    options = RenderOptions(bind="127.0.0.1:18000", mark=mark)
    text = render_haproxy(urls, placement, options, "a test")
    config = tmp_path / "haproxy.cfg"
    config.write_text(text)
    checked = subprocess.run(
        [str(haproxy_path), "-c", "-f", str(config)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "WARNING" not in checked.stdout + checked.stderr
    # Each model's backend lists its nodes in placement order (ids 1, 2, ...), each
    # tracking the one health check per node.
    names = {u: f"n{i}" for i, u in enumerate(urls, 1)}
    for model in ("a", "org/repo:Q4_K_M"):
        order = [names[u] for u in placement.order(model)]
        start = text.index(f"  # {model}\n")
        block = text[start : text.find("\n\n", start) if "\n\n" in text[start:] else None]
        servers = [line.split()[1] for line in block.splitlines() if "    server " in line]
        assert servers == order
        assert f'"{model}" "{model}-alias"' in text
    assert "org/repo:Q4_K_M" in text
    # The balancer's signed mark on every request it routes; a client's own is deleted.
    assert text.count(f'set-header x-troupe-forwarded "{mark}"') == 3 + 2
    assert "http-request del-header x-troupe-forwarded" in text
    # A node that hangs fails its checks and its sessions are cut; errors are JSON.
    assert "on-marked-down shutdown-sessions" in text
    assert 'http-error status 503 content-type application/json string "{' in text
    # and one backend per node for ?node= (that node, answering itself)
    assert text.count("track troupe_any/") == 3 + 2 + 3
    for name in names.values():
        assert f"use_backend node_{name} if {{ url_param(node) -m str {name} }}" in text


def test_the_shipped_example_is_valid(haproxy_path: Path) -> None:
    example = Path(__file__).resolve().parents[3] / "configs" / "haproxy-troupe.cfg"
    checked = subprocess.run(
        [str(haproxy_path), "-c", "-f", str(example)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
