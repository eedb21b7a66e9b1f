"""How many requests a llama-server child serves at once without one waiting 5 seconds.

cpp-httplib gives each connection to one worker thread for as long as the connection
is kept alive (5 s idle at most). llama-server starts ``--threads-http`` fixed
workers (default ``max(n_parallel + 4, cpus - 1)``, with ``--parallel`` auto meaning
4) and spawns extra ones only when it sees no idle worker, a check that races: under
load a new connection can sit queued while the workers hold idle keep-alive
connections, and it waits for their 5 s timeout (measured: requests of a 30-client
trace stalled 5.3, 10.7 and 16 s). A router that pools keep-alive connections must
therefore never hold more connections to a child than it has fixed workers.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

__all__ = ["http_threads", "parallel_slots"]

SPARE = 1  # a worker left for whoever else asks the child (a metrics scrape, a probe)


def _flag(argv: Sequence[str], names: tuple[str, ...]) -> str | None:
    value = None
    for i, word in enumerate(argv[:-1]):
        if word in names:
            value = argv[i + 1]
    for word in argv:
        for name in names:
            if word.startswith(name + "="):
                value = word.split("=", 1)[1]
    return value


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def parallel_slots(argv: Sequence[str], env: Mapping[str, str]) -> int:
    """The slots (requests decoded at once) of the child started with ``argv`` and
    ``env``: its ``--parallel``/``-np`` (or ``LLAMA_ARG_N_PARALLEL``), else 4, what
    llama-server's auto (-1, the default) gives."""
    parallel = _int(_flag(argv, ("-np", "--parallel"))) or _int(env.get("LLAMA_ARG_N_PARALLEL"))
    if parallel is None or parallel < 1:
        parallel = 4  # llama-server's auto
    return parallel


def http_threads(argv: Sequence[str], env: Mapping[str, str], cpus: int | None = None) -> int:
    """The connections a router may keep to the child started with ``argv`` and ``env``."""
    cpus = cpus or os.cpu_count() or 1
    threads = _int(_flag(argv, ("--threads-http",))) or _int(env.get("LLAMA_ARG_THREADS_HTTP"))
    if threads is None or threads < 1:
        threads = max(parallel_slots(argv, env) + 4, cpus - 1)
    return max(1, threads - SPARE)
