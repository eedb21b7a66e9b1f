"""``troupe cluster render`` and ``--cluster-nodes``: bad input is one line and a
non-zero exit, never a traceback."""

from __future__ import annotations

import socket
from pathlib import Path

from troupe_rig.cli import assert_one_line_error, run_troupe


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # nothing listens there now


def test_render_without_nodes_or_with_none_answering() -> None:
    assert_one_line_error(run_troupe("cluster", "render"), "no node given")
    assert_one_line_error(run_troupe("cluster", "render", "--node", "ftp://x"), "invalid node URL")
    assert_one_line_error(run_troupe("cluster", "frobnicate"), "unknown cluster command")
    done = run_troupe("cluster", "render", "--node", f"127.0.0.1:{_closed_port()}")
    assert_one_line_error(done, "no node answered GET /models")
    assert "did not answer GET /models" in done.stderr  # the warning names the node
    bad = run_troupe("cluster", "render", "--node", "a:1", "--maxconn-per-model", "0")
    assert_one_line_error(bad, "--maxconn-per-model")
    assert run_troupe("cluster", "--help").returncode == 0


def test_serve_with_a_bad_node_list(fake_engine_path: Path, tmp_path: Path) -> None:
    done = run_troupe(
        "serve",
        "--engine",
        str(fake_engine_path),
        "--models-dir",
        str(tmp_path),
        "--cluster-nodes",
        "ftp://a:1",
        env={"TROUPE_STATE_DIR": str(tmp_path / "state")},
    )
    assert_one_line_error(done, "invalid node URL 'ftp://a:1'")
