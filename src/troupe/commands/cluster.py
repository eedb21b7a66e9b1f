"""``troupe cluster render``: the balancer's configuration, from each node's ``/models``.

    troupe cluster render --node http://10.0.0.1:8080 --node http://10.0.0.2:8080 > haproxy.cfg
    troupe cluster render --nodes nodes.txt --bind :80 --check-interval 1s

Each node is asked for its own list (with the forward mark, so a node with
``--cluster-nodes`` does not answer for the whole cluster); a node that does not answer
is still written as a server (health-checked, in ``troupe_any``) and gets its models once
a later render reads its catalog. ``--explain`` prints each model's nodes, in order, to
stderr.
"""

from __future__ import annotations

import json
import os
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from troupe.cluster.nodes import parse_urls
from troupe.cluster.placement import Placement, node_facts
from troupe.cluster.render import (
    RenderOptions,
    placement_table,
    render_haproxy,
    render_prometheus,
    server_names,
)
from troupe.cluster.trust import ClusterTrust, read_secret
from troupe.cluster.view import FORWARDED
from troupe.errors import UsageError

__all__ = [
    "USAGE",
    "Extras",
    "fetch_models",
    "parse_flags",
    "parse_render",
    "render_config",
    "run_cluster",
]

USAGE = (
    "usage: troupe cluster render (--node URL ... | --nodes FILE) [--bind ADDR:PORT]\n"
    "       [--check-interval TIME] [--maxconn-per-model N] [--stats-socket PATH]\n"
    "       [--api-key-file FILE] [--secret-file FILE] [--agent-inter TIME]\n"
    "       [--ca-file FILE] [--prometheus FILE [--scrape-interval TIME]] [--explain]\n"
    "       (the key also from LLAMA_API_KEY, the cluster secret from TROUPE_CLUSTER_SECRET)\n"
    "       troupe cluster watch RENDER-FLAGS --out FILE [--reload CMD] [--every SECONDS]\n"
    "       troupe cluster ps (--node URL ... | --nodes FILE) [--api-key-file FILE]\n"
    "       [--secret-file FILE] [--json]"
)


def fetch_models(
    url: str,
    api_key: str | None,
    timeout: float = 5.0,
    *,
    warn: bool = True,
    trust: ClusterTrust | None = None,
    ca_file: str = "",
) -> Mapping[str, Any] | None:
    """A node's own ``GET /models``, or None (and a line on stderr, unless not ``warn``)
    when it cannot answer."""
    mark = (trust or ClusterTrust(None)).mark("render", "GET", "/models")
    headers = {FORWARDED.decode(): mark.decode("latin-1")}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url + "/models", headers=headers)
    try:
        context = ssl.create_default_context(cafile=ca_file or None)  # an https node
        with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
            doc = json.loads(resp.read())
    except (OSError, ValueError) as exc:
        reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        if warn:
            print(f"troupe: warning: {url} did not answer GET /models: {reason}", file=sys.stderr)
        return None
    return doc if isinstance(doc, dict) else None


@attrs.frozen
class Extras:
    """Render flags beyond HAProxy's configuration."""

    prometheus: Path | None = None  # --prometheus FILE: the scrape configuration's file
    key_file: str | None = None  # --api-key-file, absolute (Prometheus reads the key there)
    as_json: bool = False  # troupe cluster ps --json
    scrape_interval: str = "15s"  # --scrape-interval: Prometheus' scrape_interval


def parse_render(args: list[str]) -> tuple[list[str], RenderOptions, str | None, bool]:
    """The render flags (`parse_flags` without the extras)."""
    urls, options, key, explain, _ = parse_flags(args)
    return urls, options, key, explain


def parse_flags(args: list[str]) -> tuple[list[str], RenderOptions, str | None, bool, Extras]:
    urls: list[str] = []
    prometheus: Path | None = None
    key_file: str | None = None
    as_json = False
    scrape_interval = "15s"
    bind, interval, maxconn, socket, explain = "*:8080", "2s", 8, None, False
    agent_inter, ca_file = "1s", ""
    key: str | None = os.environ.get("LLAMA_API_KEY") or None
    secret_file: str | None = None
    i = 0
    while i < len(args):
        flag = args[i]
        if flag in ("--explain", "--json"):
            explain, as_json = explain or flag == "--explain", as_json or flag == "--json"
            i += 1
            continue
        if i + 1 >= len(args):
            raise UsageError(f"flag '{flag}' needs a value\n{USAGE}")
        value = args[i + 1]
        i += 2
        if flag == "--node":
            urls += parse_urls(value)
        elif flag == "--nodes":
            try:
                urls += parse_urls(Path(value).read_text(encoding="utf-8"), None)
            except OSError as exc:
                raise UsageError(f"cannot read --nodes '{value}': {exc.strerror}") from None
        elif flag == "--bind":
            bind = value
        elif flag == "--check-interval":
            interval = value
        elif flag == "--maxconn-per-model":
            try:
                maxconn = int(value)
            except ValueError:
                maxconn = 0
            if maxconn < 1:
                raise UsageError(f"invalid value for --maxconn-per-model: '{value}'")
        elif flag == "--stats-socket":
            socket = value
        elif flag == "--agent-inter":
            agent_inter = value
        elif flag == "--ca-file":
            if not Path(value).is_file():
                raise UsageError(f"--ca-file '{value}': no such file")
            ca_file = str(Path(value).resolve())
        elif flag == "--api-key":
            print(
                "troupe: warning: --api-key is visible to every user in ps; use "
                "--api-key-file FILE or LLAMA_API_KEY",
                file=sys.stderr,
            )
            key = value
        elif flag == "--api-key-file":
            key = _first_line(value, flag)
            key_file = str(Path(value).expanduser().resolve())
        elif flag == "--scrape-interval":
            scrape_interval = value
        elif flag == "--prometheus":
            prometheus = Path(value)
            if not prometheus.parent.is_dir():
                raise UsageError(f"--prometheus '{value}': no directory {prometheus.parent}")
        elif flag == "--secret-file":
            secret_file = value
        else:
            raise UsageError(f"unknown flag '{flag}'\n{USAGE}")
    if not urls:
        raise UsageError(f"no node given\n{USAGE}")
    unique = list(dict.fromkeys(urls))
    secret = read_secret(secret_file)
    mark = ClusterTrust(secret).balancer_mark()
    options = RenderOptions(
        bind, interval, maxconn, socket, mark, secret, agent_inter=agent_inter, ca_file=ca_file
    )
    return unique, options, key, explain, Extras(prometheus, key_file, as_json, scrape_interval)


def _first_line(path: str, flag: str) -> str:
    try:
        lines = Path(path).expanduser().read_text(encoding="utf-8").strip().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise UsageError(f"cannot read {flag} '{path}': {reason}") from None
    if not lines or not lines[0].strip():
        raise UsageError(f"{flag} '{path}' is empty")
    return lines[0].strip()


def render_config(
    urls: list[str],
    options: RenderOptions,
    key: str | None,
    known: dict[str, Mapping[str, Any]] | None = None,
    answered: set[str] | None = None,
) -> tuple[str, Placement] | None:
    """The balancer's configuration from the nodes' ``/models`` (None: no node answered).
    ``known``: the last list each node gave, used for a node that does not answer now
    (its health checks already take it out; its models keep their backends, so a node
    that blinks does not reload the balancer twice), and updated; ``answered``: set to
    the nodes that answered."""
    trust = ClusterTrust(options.secret)
    docs = {
        url: fetch_models(url, key, warn=known is None, trust=trust, ca_file=options.ca_file)
        for url in urls
    }
    if answered is not None:
        answered.clear()
        answered.update(url for url, doc in docs.items() if doc is not None)
    if known is not None:
        for url in urls:
            doc = docs[url]
            if doc is not None:
                known[url] = doc
            elif url in known:
                docs[url] = known[url]
    placement = Placement([node_facts(u, d) for u, d in docs.items() if d is not None])
    if not placement.nodes:
        return None
    agents: dict[str, int] = {}
    for url, doc in docs.items():
        extras = doc.get("troupe") if doc is not None else None
        port = extras.get("agent_port") if isinstance(extras, dict) else None
        if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536:
            agents[url] = port
    # No timestamp: the same nodes and catalogs give the same bytes (cmp tells a change).
    header = "Written by `troupe cluster render` from:\n" + "\n".join(
        f"  {server_names(urls)[u]} {u}" + ("" if docs[u] is not None else " (did not answer)")
        for u in urls
    )
    return render_haproxy(urls, placement, options, header, agents), placement


def run_cluster(args: list[str]) -> int:
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    if args[0] == "watch":
        from troupe.commands.cluster_watch import run_watch  # noqa: PLC0415 (it imports this)

        return run_watch(args[1:])
    if args[0] == "ps":
        from troupe.commands.cluster_ps import run_cluster_ps  # noqa: PLC0415 (it imports this)

        return run_cluster_ps(args[1:])
    if args[0] != "render":
        raise UsageError(f"unknown cluster command '{args[0]}'\n{USAGE}")
    urls, options, key, explain, extras = parse_flags(args[1:])
    rendered = render_config(urls, options, key)
    if rendered is None:
        raise UsageError("no node answered GET /models")
    text, placement = rendered
    sys.stdout.write(text)
    if extras.prometheus is not None:
        if key and extras.key_file is None:
            print(
                "troupe: warning: the scrape configuration names no key file (give "
                "--api-key-file FILE: Prometheus reads the key there)",
                file=sys.stderr,
            )
        scrape = render_prometheus(
            urls,
            key_file=extras.key_file,
            ca_file=options.ca_file,
            interval=extras.scrape_interval,
            header="Written by `troupe cluster render`: every node's own /metrics",
        )
        extras.prometheus.write_text(scrape, encoding="utf-8")
    if explain:
        for line in placement_table(placement, server_names(urls)):
            print(line, file=sys.stderr)
    return 0
