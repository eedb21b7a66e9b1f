"""One fleet view, behind real HAProxy: two ``troupe serve`` nodes with the real engine.

A request sent straight to a node that is not its model's home is forwarded, and the
forwarding node now says so: an access record of kind "forwarded" naming the node that
served it, and ``troupe_forwarded_total`` on its ``/metrics`` (read by
``prometheus_client``'s own parser). ``troupe cluster ps`` lists every node's models;
``troupe cluster render --prometheus`` writes a scrape configuration that real
Prometheus loads and scrapes every node with.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from troupe.cluster.trust import SECRET_ENV
from troupe_rig.cluster import ClusterStack
from troupe_rig.cluster_sdk import chat, cluster, write_catalogs
from troupe_rig.engine_process import free_port

PROMETHEUS = shutil.which("prometheus")


@pytest.fixture
def catalogs(tmp_path: Path) -> list[Path]:
    return write_catalogs(tmp_path)


def _troupe(stack: ClusterStack, *args: str) -> str:
    env = {**os.environ, SECRET_ENV: stack.secret}
    argv = [sys.executable, "-m", "troupe", "cluster", *args]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


async def test_the_forwarding_node_records_and_counts_and_the_fleet_is_one_view(
    tmp_path: Path, catalogs: list[Path], haproxy_path: Path
) -> None:
    async with cluster(tmp_path, catalogs[:2], haproxy_path) as stack:
        home, other = stack.order("tiny-a")
        # Straight to the other node (no balancer): it forwards to the home.
        served, text = await trio.to_thread.run_sync(chat, other.url, "tiny-a")
        assert (served, bool(text)) == (home.name, True)

        async with httpx.AsyncClient(timeout=30) as http:
            listed = await http.get(other.url + "/troupe/requests", params={"model": "tiny-a"})
            records = listed.json()["data"]
            assert [(r["kind"], r["node"], r["status"]) for r in records] == [
                ("forwarded", home.name, 200)
            ]
            # The home recorded it as it serves any request (its own record, its tokens).
            own = await http.get(home.url + "/troupe/requests", params={"model": "tiny-a"})
            assert [(r["kind"], r["node"]) for r in own.json()["data"]] == [("proxied", "")]
            # The forwarding node counts what it relayed to the client, as a local
            # request's record does: the home's answer, byte for byte, and its first byte.
            served_rec, forwarded = own.json()["data"][0], records[0]
            assert forwarded["bytes_out"] == served_rec["bytes_out"] > 0, (forwarded, served_rec)
            assert forwarded["ttfb"] is not None
            assert forwarded["bytes_in"] == served_rec["bytes_in"] > 0

            scraped = (await http.get(other.url + "/metrics")).text
        samples = [
            s
            for family in text_string_to_metric_families(scraped)
            for s in family.samples
            if s.name == "troupe_forwarded_total"
        ]
        assert [(s.labels, s.value) for s in samples] == [
            ({"to": home.name, "outcome": "served", "node": other.name}, 1.0)
        ]

        # A stream forwarded the same way: both records count its events' bytes (the
        # child's chunk framing left out on both), and what the client read.
        body = {"model": "tiny-a", "prompt": "hi", "max_tokens": 8, "stream": True}
        async with httpx.AsyncClient(timeout=30) as http:
            async with http.stream("POST", other.url + "/v1/completions", json=body) as resp:
                read = len(b"".join([c async for c in resp.aiter_bytes()]))
            assert resp.headers["x-troupe-node"] == home.name
            ends = []
            for node in (other, home):
                got = await http.get(node.url + "/troupe/requests", params={"model": "tiny-a"})
                ends.append(next(r for r in got.json()["data"] if r["stream"]))
        assert ends[0]["kind"] == "forwarded"
        assert ends[0]["ttft"] is not None
        assert ends[0]["bytes_out"] == ends[1]["bytes_out"] == read > 0, ends

        # troupe cluster ps: every node's models, with their slots.
        await stack.settled()
        rows = json.loads(
            await trio.to_thread.run_sync(
                _troupe, stack, "ps", "--nodes", str(stack.nodes_file), "--json"
            )
        )
        assert [(r["node"], r["name"], r["status"], r["slots"]) for r in rows] == [
            (home.name, "tiny-a", "loaded", 4)
        ]
        table = await trio.to_thread.run_sync(
            _troupe, stack, "ps", "--nodes", str(stack.nodes_file)
        )
        assert table.splitlines()[0].split()[:4] == ["NODE", "NAME", "STATUS", "SLOTS"]

        # The scrape configuration, beside HAProxy's; the key from a file, never inline.
        key = tmp_path / "key"
        key.write_text("sk-fleet\n")
        scrape = tmp_path / "prometheus.yml"
        await trio.to_thread.run_sync(
            _troupe,
            stack,
            "render",
            "--nodes",
            str(stack.nodes_file),
            "--api-key-file",
            str(key),
            "--prometheus",
            str(scrape),
            "--scrape-interval",
            "1s",
        )
        config = scrape.read_text()
        assert "sk-fleet" not in config
        assert f'credentials_file: "{key.resolve()}"' in config
        if PROMETHEUS is None:
            pytest.skip("no prometheus here")
        await _scraped_by_prometheus(tmp_path, scrape, {n.name for n in stack.nodes})


async def _scraped_by_prometheus(tmp_path: Path, config: Path, nodes: set[str]) -> None:
    assert PROMETHEUS is not None
    check = await trio.run_process(
        [str(Path(PROMETHEUS).with_name("promtool")), "check", "config", str(config)],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    port = free_port()
    argv = [
        PROMETHEUS,
        f"--config.file={config}",
        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with (tmp_path / "prometheus.log").open("wb") as log:
        process = await trio.lowlevel.open_process(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            with trio.fail_after(90):
                # Prometheus has no event to wait on from here: its API is asked.
                while True:
                    try:
                        got = await http.get(
                            f"http://127.0.0.1:{port}/api/v1/query",
                            params={"query": "up"},
                        )
                        result = got.json()["data"]["result"] if got.status_code == 200 else []
                    except httpx.HTTPError:
                        result = []
                    up = {
                        r["metric"].get("node")
                        for r in result
                        if r["metric"].get("__name__") == "up" and r["value"][1] == "1"
                    }
                    if up == nodes:
                        break
                    await trio.sleep(0.5)
    finally:
        process.terminate()
        with trio.move_on_after(10):
            await process.wait()
        if process.returncode is None:
            process.kill()
            await process.wait()
