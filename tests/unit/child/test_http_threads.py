"""How many connections troupe keeps to a child: llama-server's fixed HTTP workers, less one."""

from __future__ import annotations

from troupe.child.http_threads import http_threads


def test_the_default_is_llama_servers_own_rule() -> None:
    # --parallel auto is 4: max(4 + 4, cpus - 1) workers
    assert http_threads(["llama-server", "--model", "m.gguf"], {}, cpus=2) == 7
    assert http_threads(["llama-server"], {}, cpus=16) == 14


def test_parallel_and_threads_http_from_the_command_line_or_the_environment() -> None:
    assert http_threads(["x", "--parallel", "1"], {}, cpus=2) == 4
    assert http_threads(["x", "-np", "8"], {}, cpus=2) == 11
    assert http_threads(["x"], {"LLAMA_ARG_N_PARALLEL": "2"}, cpus=2) == 5
    assert http_threads(["x", "--threads-http", "3"], {}, cpus=2) == 2
    assert http_threads(["x"], {"LLAMA_ARG_THREADS_HTTP": "1"}, cpus=2) == 1
    assert http_threads(["x", "--parallel", "junk"], {}, cpus=2) == 7
