"""TLS between HAProxy and the nodes, and between nodes, with a certificate the test makes.

Two ``troupe serve`` nodes with the real engine listen with TLS (``--ssl-cert-file`` /
``--ssl-key-file``, llama-server's own flags), their URLs https. ``troupe cluster render
--ca-file`` writes ``ssl verify required ca-file`` on HAProxy's server lines (its health
and agent checks included); a node forwards to another over https, verifying it against
the CA that OpenSSL's ``SSL_CERT_FILE`` names. The official ``openai`` SDK talks to the
balancer.
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess
from functools import partial
from pathlib import Path

import pytest
import trio

from troupe_rig.cluster import ClusterStack, haproxy_command, open_cluster
from troupe_rig.cluster_sdk import CTX, LONG, chat, long_chat, write_catalogs

OPENSSL = shutil.which("openssl")


def _certificates(directory: Path) -> tuple[Path, Path, Path]:
    """(the CA's certificate, the nodes' certificate for 127.0.0.1, its key)."""
    assert OPENSSL is not None
    ca_key, ca, key, csr, cert = (
        directory / n for n in ("ca.key", "ca.pem", "node.key", "node.csr", "node.pem")
    )
    ext = directory / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    for argv in (
        ["req", "-x509", *ec, "-keyout", ca_key, "-out", ca, "-days", "1", "-subj", "/CN=test CA"],
        ["req", *ec, "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1"],
        [
            "x509",
            "-req",
            "-in",
            csr,
            "-CA",
            ca,
            "-CAkey",
            ca_key,
            "-CAcreateserial",
            "-out",
            cert,
            "-days",
            "1",
            "-extfile",
            ext,
        ],
    ):
        subprocess.run([OPENSSL, *map(str, argv)], check=True, capture_output=True)
    return ca, cert, key


@pytest.mark.skipif(OPENSSL is None, reason="no openssl: scripts/test installs it (apt)")
async def test_haproxy_and_the_nodes_speak_tls_verified_by_the_test_ca(
    tmp_path: Path, haproxy_path: Path
) -> None:
    ca, cert, key = _certificates(tmp_path)
    catalogs = write_catalogs(tmp_path)[:2]
    args = ["--models-max", "2", "--ctx-size", str(CTX)]
    args += ["--ssl-cert-file", str(cert), "--ssl-key-file", str(key)]
    async with open_cluster(
        tmp_path / "cluster",
        catalogs,
        args,
        haproxy=haproxy_path,
        env={"SSL_CERT_FILE": str(ca)},
        render_args=["--ca-file", str(ca)],
    ) as stack:
        assert all(n.url.startswith("https://") for n in stack.nodes)
        assert f"ssl verify required ca-file {ca}" in stack.config
        # (every node is UP: HAProxy's health checks over TLS verified the certificate)
        for model in ("tiny-a", "tiny-b"):
            node, text = await trio.to_thread.run_sync(chat, stack.url, model)
            assert (node, bool(text)) == (stack.order(model)[0].name, True)

        # Landing on the node that is not tiny-a's home (its model past HAProxy's
        # buffer): forwarded to the home over https, served there.
        home, other = stack.order("tiny-a")
        async with stack.landing_on(other):
            served, text, prompt = await trio.to_thread.run_sync(
                partial(long_chat, stack.url, "tiny-a", "x" * LONG, model_last=True)
            )
        assert (served, bool(text)) == (home.name, True)
        assert prompt > 100

        # The agent checks are plain TCP beside TLS: tiny-a's home says its 4 slots.
        with trio.fail_after(30):
            while await _slim(stack, "tiny-a", home.name) != "4":  # noqa: ASYNC110
                await trio.sleep(0.1)  # HAProxy has no event to wait on


async def _slim(stack: ClusterStack, model: str, server: str) -> str:
    text = await haproxy_command(stack.socket, "show stat")
    rows = csv.DictReader(io.StringIO(text.removeprefix("# ")))
    for row in rows:
        if row.get("pxname", "").split("_", 1)[-1] == model and row.get("svname") == server:
            return row.get("slim", "")
    return ""
