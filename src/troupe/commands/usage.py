"""``troupe usage``: what each tenant of a running router used, per day and model.

Asks ``GET /troupe/usage`` of ``--url`` (default: ``$TROUPE_URL``, else
http://127.0.0.1:8080) with ``--api-key`` (default ``$LLAMA_API_KEY``): one row per
tenant, UTC day and model (requests, prompt and generated tokens), the requests refused
by a limit, then each tenant's totals. A tenant that is not admin sees only its own.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import httpx

from troupe.commands.table import print_table
from troupe.errors import TroupeError, UsageError

__all__ = ["run_usage"]

USAGE = (
    "usage: troupe usage [--url URL] [--api-key KEY] [--tenant NAME] [--model NAME]\n"
    "                    [--from YYYY-MM-DD] [--to YYYY-MM-DD] [--json]"
)
HEADERS = ("TENANT", "DAY", "MODEL", "REQUESTS", "PROMPT", "GENERATED", "TOTAL", "REJECTED")
_QUERY_FLAGS = {"--tenant": "tenant", "--model": "model", "--from": "from", "--to": "to"}


def _parse(args: list[str]) -> tuple[str, str | None, dict[str, str], bool]:
    url = os.environ.get("TROUPE_URL", "http://127.0.0.1:8080")
    key = os.environ.get("LLAMA_API_KEY") or None
    query: dict[str, str] = {}
    as_json = False
    it = iter(args)
    for arg in it:
        if arg in ("--url", "--api-key", *_QUERY_FLAGS):
            value = next(it, None)
            if value is None:
                raise UsageError(f"flag '{arg}' needs a value")
            if arg == "--url":
                url = value
            elif arg == "--api-key":
                key = value.split(",")[0]
            else:
                query[_QUERY_FLAGS[arg]] = value
        elif arg == "--json":
            as_json = True
        else:
            raise UsageError(f"unknown argument '{arg}' ({USAGE})")
    return url, key, query, as_json


def _rejected(row: dict[str, Any]) -> str:
    rejected = row.get("rejected") or {}
    return ", ".join(f"{reason} {count}" for reason, count in rejected.items()) or "-"


def run_usage(args: list[str]) -> int:
    if any(a in ("-h", "--help") for a in args):
        print(USAGE)
        return 0
    url, key, query, as_json = _parse(list(args))
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        resp = httpx.get(
            url.rstrip("/") + "/troupe/usage", params=query, headers=headers, timeout=10.0
        )
    except httpx.HTTPError as exc:
        raise TroupeError(f"no router answered at {url}: {exc}") from None
    if resp.status_code == 401:
        raise TroupeError(f"{url} wants an API key: give --api-key KEY (or LLAMA_API_KEY)")
    try:
        data = resp.json()
    except ValueError:
        data = None
    if resp.status_code != 200 or not isinstance(data, dict) or "data" not in data:
        message = data.get("error", {}).get("message") if isinstance(data, dict) else None
        raise TroupeError(f"{url}/troupe/usage answered {resp.status_code}: {message or resp.text}")
    if as_json:
        json.dump(data, sys.stdout, indent=2)
        print()
        return 0
    rows = [
        (
            r["tenant"] or "-",
            r["day"],
            r["model"] or "(refused)",
            str(r["requests"]),
            str(r["prompt_tokens"]),
            str(r["completion_tokens"]),
            str(r["total_tokens"]),
            _rejected(r),
        )
        for r in data["data"]
    ]
    rows += [
        (
            t["tenant"] or "-",
            "total",
            "",
            str(t["requests"]),
            str(t["prompt_tokens"]),
            str(t["completion_tokens"]),
            str(t["total_tokens"]),
            _rejected(t),
        )
        for t in data.get("totals", [])
    ]
    print_table(HEADERS, rows)
    if not data["data"]:
        print(f"(no usage recorded at {url})")
    return 0
