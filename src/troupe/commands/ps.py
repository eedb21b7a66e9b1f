"""``troupe ps``: what a running router has loaded (like ``ollama ps``).

One row per model with a child (loading, with the load's percentage; loaded, sleeping
or stopping): its port and pid, the memory it holds (what was seen, else the need
admission counts, with where that figure comes from), requests in flight and queued,
how long it has been up and since its last request. Asks ``GET /models`` of ``--url``
(default: ``$TROUPE_URL``, else http://127.0.0.1:8080).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import httpx

from troupe.commands.table import print_table
from troupe.commands.urls import default_url, router_url
from troupe.errors import TroupeError, UsageError
from troupe.hardware.feasibility import format_bytes

__all__ = ["ps_rows", "run_ps"]

USAGE = "usage: troupe ps [--url URL] [--api-key KEY] [--json]"
HEADERS = ("NAME", "STATUS", "PORT", "PID", "MEMORY", "IN FLIGHT", "QUEUE", "UP", "IDLE")
_SHOWN = ("loading", "loaded", "sleeping")


def _parse(args: list[str]) -> tuple[str, str | None, bool]:
    url = default_url()
    key = os.environ.get("LLAMA_API_KEY") or None
    as_json = False
    it = iter(args)
    for arg in it:
        if arg in ("--url", "--api-key"):
            value = next(it, None)
            if value is None:
                raise UsageError(f"flag '{arg}' needs a value")
            if arg == "--url":
                url = router_url(value)
            else:
                key = value.split(",")[0]
        elif arg == "--json":
            as_json = True
        else:
            raise UsageError(f"unknown argument '{arg}' ({USAGE})")
    return url, key, as_json


def _memory(extra: dict[str, Any]) -> tuple[int | None, str]:
    memory = extra.get("memory")
    if not isinstance(memory, dict):
        return None, "-"
    used = memory.get("used_bytes")
    if isinstance(used, dict) and used:
        return sum(used.values()), "observed"
    need = memory.get("need_bytes")
    if isinstance(need, dict) and need:
        return sum(need.values()), str(memory.get("source") or "?")
    return None, "-"


def ps_rows(models: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for item in models:
        status = item.get("status")
        value = status.get("value") if isinstance(status, dict) else None
        extra = item.get("troupe")
        if value not in _SHOWN or not isinstance(extra, dict):
            continue
        memory, source = _memory(extra)
        rows.append(
            {
                "name": item["id"],
                "status": "stopping" if extra.get("stopping") else value,
                "percent": extra.get("load_percent") if value == "loading" else None,
                "port": extra.get("port"),
                "pid": extra.get("pid"),
                "memory_bytes": memory,
                "memory_source": source,
                "in_flight": extra.get("in_flight", 0),
                "waiting": extra.get("waiting", 0),
                "up_seconds": extra.get("up_seconds"),
                "idle_seconds": extra.get("idle_seconds"),
            }
        )
    return rows


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def run_ps(args: list[str]) -> int:
    if any(a in ("-h", "--help") for a in args):
        print(USAGE)
        return 0
    url, key, as_json = _parse(list(args))
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        resp = httpx.get(url.rstrip("/") + "/models", headers=headers, timeout=5.0)
    except httpx.HTTPError as exc:
        raise TroupeError(f"no router answered at {url}: {exc}") from None
    if resp.status_code == 401:
        raise TroupeError(f"{url} wants an API key: give --api-key KEY (or LLAMA_API_KEY)")
    try:
        data = resp.json()["data"]
    except (ValueError, KeyError, TypeError):
        raise TroupeError(f"{url}/models did not answer a model list") from None
    rows = ps_rows([m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)])
    if as_json:
        json.dump(rows, sys.stdout, indent=2)
        print()
        return 0
    table = [
        (
            r["name"],
            r["status"] if r["percent"] is None else f"{r['status']} {r['percent']}%",
            str(r["port"] or "-"),
            str(r["pid"] or "-"),
            f"{format_bytes(r['memory_bytes'])} ({r['memory_source']})"
            if r["memory_bytes"] is not None
            else "-",
            str(r["in_flight"]),
            str(r["waiting"]),
            _duration(r["up_seconds"]),
            _duration(r["idle_seconds"]),
        )
        for r in rows
    ]
    print_table(HEADERS, table)
    if not rows:
        print(f"(no model loaded at {url})")
    return 0
