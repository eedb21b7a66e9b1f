"""``troupe cluster ps``: every node's models in one table (``troupe ps`` for a fleet).

    troupe cluster ps --nodes /etc/troupe/nodes.txt --api-key-file key --secret-file secret

Each node is asked for its own ``GET /models`` (signed with the cluster secret, as
`troupe cluster render` asks: the node answers for itself, not the cluster), and each
model with a child is one row: the node (its server name, as the balancer's
configuration names it), the model, its status, its child's slots, requests in flight
and queued, memory, up and idle times (`troupe.commands.ps`'s columns). A node that
does not answer is a row of its own.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from troupe.cluster.render import server_names
from troupe.cluster.trust import ClusterTrust
from troupe.commands.cluster import fetch_models, parse_flags
from troupe.commands.ps import _duration, ps_rows
from troupe.commands.table import print_table
from troupe.hardware.feasibility import format_bytes

__all__ = ["cluster_rows", "run_cluster_ps"]

HEADERS = ("NODE", "NAME", "STATUS", "SLOTS", "IN FLIGHT", "QUEUE", "MEMORY", "UP", "IDLE")


def cluster_rows(docs: dict[str, dict[str, Any] | None]) -> list[dict[str, Any]]:
    """One row per model with a child on each node (node order kept); a node that did
    not answer: one row with ``status`` "unreachable"."""
    names = server_names(list(docs))
    rows: list[dict[str, Any]] = []
    for url, doc in docs.items():
        node = {"node": names[url], "url": url}
        data = doc.get("data") if doc is not None else None
        if not isinstance(data, list):
            rows.append({**node, "name": "-", "status": "unreachable"})
            continue
        items = [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]
        slots = {m["id"]: (m.get("troupe") or {}).get("slots") for m in items}
        for row in ps_rows(items):
            rows.append({**node, **row, "slots": slots.get(row["name"])})
    return rows


def run_cluster_ps(args: list[str]) -> int:
    urls, options, key, _, extras = parse_flags(args)
    trust = ClusterTrust(options.secret)
    docs: dict[str, dict[str, Any] | None] = {}
    for url in urls:
        doc = fetch_models(url, key, warn=False, trust=trust, ca_file=options.ca_file)
        docs[url] = dict(doc) if doc is not None else None
    rows = cluster_rows(docs)
    if extras.as_json:
        json.dump(rows, sys.stdout, indent=2)
        print()
        return 0
    table = []
    for r in rows:
        if r["status"] == "unreachable":
            table.append((r["node"], "-", f"unreachable ({r['url']})", *("-",) * 6))
            continue
        memory = r.get("memory_bytes")
        table.append(
            (
                r["node"],
                r["name"],
                r["status"] if r.get("percent") is None else f"{r['status']} {r['percent']}%",
                str(r["slots"] or "-"),
                str(r["in_flight"]),
                str(r["waiting"]),
                f"{format_bytes(memory)} ({r['memory_source']})" if memory is not None else "-",
                _duration(r.get("up_seconds")),
                _duration(r.get("idle_seconds")),
            )
        )
    print_table(HEADERS, table)
    if not rows:
        print("(no model loaded on any node)")
    return 0
