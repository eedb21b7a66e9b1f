"""HAProxy's configuration for a cluster: pure text from the nodes' placement.

The balancer routes by the model the request names: the body's ``model`` (it reads up
to ``tune.bufsize`` of it, ``option http-buffer-request``) or the ``?model=`` query
(GET routes, the ``/v1/realtime`` WebSocket). Each model has a backend of its own whose
servers are the nodes that can hold it, in the model's placement order, with ``balance
first``: the home node takes every request while it has fewer than ``maxconn`` of that
model's requests in flight, the next node takes the overflow (bounded load), and a node
that fails its health check is skipped until it passes again (its models come back to
it). A request whose model the balancer cannot read (past the buffer, not JSON) goes to
any node (``troupe_any``), which forwards it once to the model's node; the balancer
marks every request it routed by model, so a node serves those where they land.

``?node=NAME`` (a server name: n1, n2, ...) reaches that node whatever the request,
marked so that it answers itself: its ``/metrics``, ``/models/sse``, its own
``/v1/models``; a name the cluster does not have is a 404, a node that is down a 503.

Only a connection that never opened is retried on another node (``retry-on
conn-failure``): a request that reached a node may have started generating. Timeouts
leave an SSE stream or a WebSocket session an hour of silence (a long prefill sends
nothing for a while).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

import attrs

from troupe.cluster.placement import Placement

__all__ = [
    "NODE_HEADER",
    "RenderOptions",
    "backend_name",
    "render_haproxy",
    "render_prometheus",
    "server_names",
]

_IDENT = re.compile(r"[^A-Za-z0-9_.:-]")
NODE_HEADER = b"X-Troupe-Node"  # the node that served a request (set by the forwarding node)
# The balancer names the node it sent a request to (a cold line's server "n2-cold" is
# node n2), unless that node forwarded it on and named the node that served it.
_NAME_NODE = (
    "    http-response set-header X-Troupe-Node %[srv_name,field(1,-)]"
    " unless { res.hdr(x-troupe-node) -m found }"
)


@attrs.frozen
class RenderOptions:
    bind: str = "*:8080"
    check_interval: str = "2s"
    maxconn_per_model: int = 8  # a model's requests in flight on one node before it spills
    stats_socket: str | None = None  # the runtime API (show servers state, set server ...)
    mark: str = "balancer"  # the forward mark HAProxy sets (signed: `ClusterTrust.balancer_mark`)
    secret: bytes | None = attrs.field(default=None, repr=False)  # the cluster secret
    agent_inter: str = "1s"  # how often HAProxy asks each node's agent (cluster.agent)
    # TLS to the nodes: the CA that signed their certificates ("": plain HTTP, unless a
    # node's URL says https, then verified against the system's CAs).
    ca_file: str = ""


def server_names(urls: Sequence[str]) -> dict[str, str]:
    """Node URL -> its server name (n1, n2, ... in list order)."""
    return {url: f"n{i}" for i, url in enumerate(urls, 1)}


def backend_name(index: int, model: str) -> str:
    return f"m{index}_{_IDENT.sub('_', model)}"[:100]


def _quoted(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _json_error(message: str, kind: str, code: int) -> str:
    body = f'{{"error":{{"message":"{message}","type":"{kind}","code":{code}}}}}'
    return f"content-type application/json string {_quoted(body)}"


def _address(url: str) -> str:
    parts = urlsplit(url)
    default = 443 if parts.scheme == "https" else 80
    return f"{parts.hostname}:{parts.port or default}"


def _agent(port: int | None, inter: str, query: str) -> str:
    """The server line's agent check (`troupe.cluster.agent`), asking about ``query``."""
    if port is None:
        return ""
    send = _quoted(query).replace("\t", "\\t")[:-1] + '\\n"'
    # weight 100: the agent's percentages are of this (1% of the default 1 would be 0).
    return f" weight 100 agent-check agent-port {port} agent-inter {inter} agent-send {send}"


def _tls(url: str, options: RenderOptions) -> str:
    """TLS to the node: when its URL says https or a CA file is given."""
    if options.ca_file:
        return f" ssl verify required ca-file {options.ca_file}"
    if urlsplit(url).scheme == "https":
        return " ssl verify required ca-file @system-ca"
    return ""


def render_haproxy(
    urls: Sequence[str],
    placement: Placement,
    options: RenderOptions,
    header: str = "",
    agents: Mapping[str, int] | None = None,
) -> str:
    """The whole ``haproxy.cfg`` for the nodes ``urls`` (every node, those that did not
    answer included: they get health-checked and join the model backends once a render
    reads their catalog). ``agents``: each node's agent port, where it has one (its
    ``/models`` says): the server lines ask it what the node can take."""
    agents = agents or {}
    names = server_names(urls)
    orders = placement.models()
    aliases: dict[str, list[str]] = {m: [] for m in orders}
    for name, model in sorted(placement.names().items()):
        if model in aliases and name != model:
            aliases[model].append(name)
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    lines += [
        "global",
        "    maxconn 4096",
        "    # tune.bufsize stays at its default (16384): a request whose model lies past",
        "    # it goes to any node, which forwards it once to the model's node.",
    ]
    if options.stats_socket:
        lines.append(f"    stats socket {options.stats_socket} mode 600 level admin")
    lines += [
        "",
        "defaults",
        "    mode http",
        "    option http-buffer-request",
        "    option httpchk GET /health",
        "    http-check expect status 200",
        "    option redispatch 1",
        "    retries 2",
        "    retry-on conn-failure",
        "    timeout connect 3s",
        "    timeout client 1h",
        "    timeout server 1h",
        "    timeout tunnel 1h",
        "    timeout http-request 60s",
        "    timeout http-keep-alive 60s",
        "    timeout queue 60s",
        "    timeout client-fin 5s",
        "    timeout server-fin 5s",
        "    # A health check that gets no answer within this fails: a node that hangs",
        "    # (stopped, not dead) is out after two, and its sessions are cut then",
        "    # (on-marked-down) rather than waiting out 'timeout server'.",
        "    timeout check 2s",
        f"    default-server inter {options.check_interval} fall 2 rise 1"
        " on-marked-down shutdown-sessions",
        "    # HAProxy's own errors in llama.cpp's JSON shape, as the nodes answer.",
        "    http-error status 502 " + _json_error("no node answered", "unavailable_error", 502),
        "    http-error status 503 "
        + _json_error("no node is available for this request", "unavailable_error", 503),
        "    http-error status 504 "
        + _json_error("the node did not answer in time", "unavailable_error", 504),
        "",
        "frontend troupe",
        f"    bind {options.bind}",
        "    http-request del-header x-troupe-forwarded",
        "    http-request set-var(txn.model) req.body,json_query('$.model') if METH_POST",
        "    http-request set-var(txn.model) url_param(model) if !{ var(txn.model) -m found }",
        "    acl node_named url_param(node) -m found",
        f"    acl node_known url_param(node) -m str {' '.join(names.values())}",
        "    http-request return status 404 "
        + _json_error("no such node", "not_found_error", 404)
        + " if node_named !node_known",
    ]
    lines += [
        f"    use_backend node_{name} if {{ url_param(node) -m str {name} }}"
        for name in names.values()
    ]
    backends: list[tuple[str, str, list[str]]] = []
    for index, (model, order) in enumerate(sorted(orders.items()), 1):
        backend = backend_name(index, model)
        backends.append((backend, model, order))
        patterns = " ".join(_quoted(n) for n in [model, *aliases[model]])
        lines.append(f"    use_backend {backend} if {{ var(txn.model) -m str {patterns} }}")
    lines += [
        "    default_backend troupe_any",
        "",
        "backend troupe_any",
        "    balance leastconn",
        _NAME_NODE,
    ]
    lines += [
        f"    server {names[u]} {_address(u)} check{_tls(u, options)}"
        + _agent(agents.get(u), options.agent_inter, "")
        for u in urls
    ]
    down = _json_error("this node is down", "unavailable_error", 503)
    for url, name in names.items():
        lines += [
            "",
            f"backend node_{name}  # ?node={name}: that node, answering itself",
            f"    http-request set-header x-troupe-forwarded {_quoted(options.mark)}",
            _NAME_NODE,
            f"    http-error status 503 {down}",
            f"    server {name} {_address(url)}{_tls(url, options)} track troupe_any/{name}",
        ]
    for backend, model, order in backends:
        lines += [
            "",
            f"backend {backend}  # {model}",
            "    balance first",
            f"    http-request set-header x-troupe-forwarded {_quoted(options.mark)}",
            _NAME_NODE,
        ]
        # The home, then each other node while the model is loaded there (its warm
        # line), then each while it is not (its cold line, where it has an agent to say
        # which: `troupe.cluster.agent`).
        listed = [u for u in order if u in names]
        rows = [(u, names[u], "") for u in listed[:1]]
        rows += [(u, names[u], "\twarm" if u in agents else "") for u in listed[1:]]
        rows += [(u, f"{names[u]}-cold", "\tcold") for u in listed[1:] if u in agents]
        for rank, (url, server, role) in enumerate(rows, 1):
            lines.append(
                f"    server {server} {_address(url)} id {rank} "
                f"maxconn {options.maxconn_per_model}{_tls(url, options)} "
                f"track troupe_any/{names[url]}"
                + _agent(agents.get(url), options.agent_inter, model + role)
            )
    return "\n".join(lines) + "\n"


def placement_table(placement: Placement, names: Mapping[str, str]) -> list[str]:
    """One line per model: its nodes in order (for ``--explain``)."""
    return [
        f"{model}: {' '.join(names.get(u, u) for u in order)}"
        for model, order in sorted(placement.models().items())
    ]


def render_prometheus(
    urls: Sequence[str],
    *,
    key_file: str | None = None,
    ca_file: str = "",
    interval: str = "15s",
    header: str = "",
) -> str:
    """A Prometheus scrape configuration (YAML) for every node's own ``/metrics``: each
    node a target labelled with its server name (``node``, as the node labels its own
    samples: ``honor_labels`` keeps them). The API key is read by Prometheus from
    ``key_file`` (never written into this file); ``ca_file`` verifies https nodes."""
    names = server_names(urls)
    lines = [f"# {line}" if line else "#" for line in header.splitlines()]
    lines += ["scrape_configs:"]
    by_scheme: dict[str, list[str]] = {}
    for url in urls:
        by_scheme.setdefault(urlsplit(url).scheme or "http", []).append(url)
    for scheme, members in by_scheme.items():
        job = "troupe" if len(by_scheme) == 1 else f"troupe-{scheme}"
        lines += [
            f"  - job_name: {job}",
            "    metrics_path: /metrics",
            f"    scheme: {scheme}",
            f"    scrape_interval: {interval}",
            "    honor_labels: true",
        ]
        if key_file:
            lines += ["    authorization:", f"      credentials_file: {_quoted(key_file)}"]
        if scheme == "https" and ca_file:
            lines += ["    tls_config:", f"      ca_file: {_quoted(ca_file)}"]
        lines += ["    static_configs:"]
        for url in members:
            lines += [
                f"      - targets: [{_quoted(_address(url))}]",
                f"        labels: {{node: {names[url]}}}",
            ]
    return "\n".join(lines) + "\n"
