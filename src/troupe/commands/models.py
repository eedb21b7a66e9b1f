"""``troupe models``: the catalog as a table, with live status from a running router.

Takes the same flags as ``troupe serve`` (so it shows exactly what that router would
serve) plus ``--url`` for the router to ask for status; by default it asks the
address those flags would listen on and shows "-" when nothing answers.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from troupe.actors.memory import gpu_name
from troupe.catalog import build_catalog
from troupe.catalog.facts import FactsCache, file_bytes
from troupe.catalog.figure import child_context, estimated_need
from troupe.commands.table import print_table
from troupe.commands.urls import default_url, router_url
from troupe.errors import ConfigError, TroupeError, UsageError
from troupe.gguf import ModelFacts
from troupe.hardware.devices import read_devices
from troupe.hardware.feasibility import feasibility, format_bytes
from troupe.prepare import prepare_router

__all__ = ["model_rows", "run_models"]

USAGE = """\
usage: troupe models [--url URL] [--json] [troupe serve flags...]

Lists the models troupe serves: name, source, size on disk, the context each
child runs with, capabilities, whether it fits this machine, and its status.

  --url URL        the router to ask (default: $TROUPE_URL, else
                   http://127.0.0.1:8080). Alone, it lists that router's
                   models; with catalog flags, their status there
  --json           one JSON object per model instead of the table
  serve flags      --models-dir, --models-preset, --config, --ctx-size, ...:
                   the catalog those flags give, read here (status from
                   the router they would listen on)

Without catalog flags, troupe models asks the default router; when none
answers, it lists the Hugging Face cache's models."""
HEADERS = ("NAME", "SOURCE", "SIZE", "CONTEXT", "NEED", "CAPABILITIES", "FIT", "STATUS")


def _take(args: list[str], flag: str) -> str | None:
    if flag not in args:
        return None
    i = args.index(flag)
    if i + 1 >= len(args):
        raise UsageError(f"flag '{flag}' needs a value")
    value = args[i + 1]
    del args[i : i + 2]
    return value


def _router_models(url: str, api_keys: Sequence[str]) -> list[dict[str, Any]] | None:
    """The router's ``GET /models`` entries, or None when nothing usable answers."""
    headers = {"Authorization": f"Bearer {api_keys[0]}"} if api_keys else {}
    try:
        resp = httpx.get(url.rstrip("/") + "/models", headers=headers, timeout=1.0)
        data = resp.json()["data"]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(data, list):
        return None
    return [m for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]


def _status_of(item: dict[str, Any]) -> str:
    status = item.get("status")
    value = status.get("value") if isinstance(status, dict) else None
    return value if isinstance(value, str) else "?"


def _remote_row(item: dict[str, Any]) -> dict[str, Any]:
    """A row from a router's ``/models`` entry (``--url`` without a catalog here)."""
    extra = item.get("troupe")
    gguf = extra.get("gguf") if isinstance(extra, dict) else None
    gguf = gguf if isinstance(gguf, dict) else {}
    memory = extra.get("memory") if isinstance(extra, dict) else None
    context = extra.get("context") if isinstance(extra, dict) else None
    need = memory.get("need_bytes") if isinstance(memory, dict) else None
    arch = item.get("architecture")
    inputs = arch.get("input_modalities", []) if isinstance(arch, dict) else []
    caps = [m for m in inputs if isinstance(m, str) and m != "text"]
    if gguf.get("embedding"):
        caps.append("embedding")
    if gguf.get("tools"):
        caps.append("tools")
    return {
        "name": item["id"],
        "source": str(item.get("source", "?")),
        "size_bytes": gguf.get("file_bytes", gguf.get("size_bytes")),
        "context": context.get("n_ctx") if isinstance(context, dict) else None,
        "context_why": context.get("why") if isinstance(context, dict) else None,
        "capabilities": ",".join(["text", *caps]),
        "aliases": list(item.get("aliases") or []),
        "need_bytes": sum(need.values()) if isinstance(need, dict) else None,
        "need_source": memory.get("source") if isinstance(memory, dict) else None,
        "fit": str(memory.get("feasibility", "?")) if isinstance(memory, dict) else "?",
        "status": _status_of(item),
    }


def _need(row: dict[str, Any]) -> str:
    """The need as doctor shows it: the figure, then where it comes from."""
    if row["need_bytes"] is None:
        return "?"
    return f"{format_bytes(row['need_bytes'])} ({row['need_source'] or '?'})"


def _capabilities(facts: ModelFacts | str | None, inputs: Sequence[str]) -> str:
    caps = [m for m in inputs if m != "text"]
    if isinstance(facts, ModelFacts):
        if facts.rejection:
            return "not a text model"
        if facts.is_embedding:
            caps.append("embedding")
        if facts.chat_template_mentions_tools:
            caps.append("tools")
        if facts.mtp_layers:
            caps.append(f"mtp:{facts.mtp_layers}")
    return ",".join(["text", *caps])


def model_rows(argv: Sequence[str]) -> tuple[list[dict[str, Any]], str, tuple[str, ...]]:
    """One dict per catalog entry, the URL a router with these flags would use, and
    its API keys (to ask it for status)."""
    prepared = prepare_router(argv)
    if isinstance(prepared, list):
        raise UsageError("troupe models lists a router's catalog; -m/-hf name a single model")
    _engine, table, settings = prepared
    facts = FactsCache()
    try:
        catalog = build_catalog(settings, table, os.environ, Path.cwd(), probe=facts.architecture)
    except ConfigError as exc:
        raise ConfigError(f"failed to initialize router models: {exc}") from None
    rows = []
    devices = read_devices()
    gpus = tuple(gpu_name(g.index) for g in devices.gpus)
    kv_store = settings.kv_store == "on"
    for entry in catalog.visible():
        f = facts.facts(entry.model_path)
        # The figure the router would show for these flags (troupe.catalog.figure): the
        # context its child starts with, the estimate for its own KV layout.
        need = estimated_need(entry, facts, gpus, kv_store=kv_store)
        context = child_context(entry, facts)
        fit = None
        if need:
            fit = feasibility(
                sum(need.values()),
                ram_total=devices.host.total,
                gpu_totals=[g.total for g in devices.gpus],
            )
        rows.append(
            {
                "name": entry.name,
                "source": str(entry.source),
                "size_bytes": file_bytes(entry.model_path, f),
                "context": context.n_ctx if context is not None else None,
                "context_why": context.why if context is not None else None,
                "capabilities": _capabilities(f, entry.architecture.input_modalities),
                "aliases": list(entry.sorted_aliases),
                "need_bytes": sum(need.values()) if need else None,
                "need_source": "estimate" if need else None,  # the GGUF header's
                "fit": str(fit.colour) if fit else "?",
            }
        )
    host = settings.hosts[0]
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{settings.port}"
    return rows, url, settings.api_keys


_CATALOGUE_FLAGS = ("--models-dir", "--models-preset", "--config", "-hf", "--hf-repo")


def _names_a_catalog(args: Sequence[str]) -> bool:
    """Whether the flags name models here (else ``--url`` alone asks the router there)."""
    return any(a.split("=", 1)[0] in _CATALOGUE_FLAGS for a in args)


def _api_keys(args: Sequence[str]) -> tuple[str, ...]:
    keys = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--api-key"]
    keys += [a.split("=", 1)[1] for a in args if a.startswith("--api-key=")]
    env = os.environ.get("LLAMA_API_KEY")
    return tuple(k for key in keys for k in key.split(",") if k) or ((env,) if env else ())


def run_models(args: list[str]) -> int:
    args = list(args)
    if any(a in ("-h", "--help") for a in args):
        print(USAGE)
        return 0
    given = _take(args, "--url")
    url_flag = router_url(given) if given is not None else None
    as_json = "--json" in args
    if as_json:
        args.remove("--json")
    # No catalog named here: the router at --url, else (as `troupe ps`) the default one.
    found: list[dict[str, Any]] | None = None
    if not _names_a_catalog(args):
        found = _router_models(url_flag or default_url(), _api_keys(args))
        if found is None and url_flag is not None:
            raise TroupeError(f"no troupe or llama.cpp router answered at {url_flag}")
    if found is not None:
        # `troupe models [--url URL]`: the router there is the catalog.
        rows = [_remote_row(m) for m in found]
        statuses: dict[str, str] | None = {r["name"]: r["status"] for r in rows}
    else:
        rows, flags_url, keys = model_rows(args)
        answered = _router_models(url_flag or flags_url, keys)
        statuses = {m["id"]: _status_of(m) for m in answered} if answered is not None else None
        remote = {m["id"]: _remote_row(m) for m in answered or ()}
        for row in rows:
            row["status"] = statuses.get(row["name"], "-") if statuses is not None else "-"
            there = remote.get(row["name"])
            if there is not None and there["need_bytes"] is not None:
                # The running router's figure (the engine's projection, once made): the
                # one memory need everywhere, with its source.
                row["need_bytes"], row["need_source"] = there["need_bytes"], there["need_source"]
                row["fit"] = there["fit"]
    if not rows and found is not None:
        print(f"(no models at {url_flag or default_url()})")
        return 0
    if not rows:
        raise TroupeError(
            f"no models: no router answered at {url_flag or default_url()}; give --url URL"
            " of a running router, --models-dir or --models-preset (or put GGUF files in"
            " the Hugging Face cache)"
        )
    if as_json:
        json.dump(rows, sys.stdout, indent=2)
        print()
        return 0
    table = [
        (
            r["name"],
            r["source"],
            format_bytes(r["size_bytes"]),
            str(r["context"] or "?"),
            _need(r),
            r["capabilities"],
            r["fit"],
            r["status"],
        )
        for r in rows
    ]
    print_table(HEADERS, table)
    if statuses is None:
        print(f"(no router answered at {url_flag or flags_url}: status unknown)")
    return 0
