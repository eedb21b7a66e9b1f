"""The forward mark, signed with the cluster secret (`troupe.cluster.trust`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from troupe.cluster.trust import MARK_WINDOW, ClusterTrust, read_secret
from troupe.errors import UsageError

TRUST = ClusterTrust(b"s3cret")


def test_a_nodes_mark_verifies_for_its_own_request_line_and_only_for_a_while() -> None:
    mark = TRUST.mark("node-a", "POST", "/v1/chat/completions", now=1000).decode()
    assert TRUST.verify(mark, "POST", "/v1/chat/completions", now=1000)
    assert TRUST.verify(mark, "POST", "/v1/chat/completions", now=1000 + MARK_WINDOW)
    assert not TRUST.verify(mark, "POST", "/v1/chat/completions", now=1001 + MARK_WINDOW)
    assert not TRUST.verify(mark, "POST", "/v1/completions", now=1000)  # another request
    assert not TRUST.verify(mark, "GET", "/v1/chat/completions", now=1000)
    assert not ClusterTrust(b"other").verify(mark, "POST", "/v1/chat/completions", now=1000)


def test_made_up_marks_are_refused_and_the_balancers_token_is_accepted() -> None:
    for forged in ("n0", "balancer", "balancer;k=", "x;t=1000;s=00", "x;t=soon;s=1", ""):
        assert not TRUST.verify(forged, "GET", "/models", now=1000), forged
    assert TRUST.verify(TRUST.balancer_mark(), "POST", "/anything", now=5)
    assert "s3cret" not in TRUST.balancer_mark()
    assert not TRUST.verify(ClusterTrust(b"x").balancer_mark(), "GET", "/models")


def test_without_a_secret_every_mark_is_trusted_as_before() -> None:
    plain = ClusterTrust(None)
    assert not plain.signed
    assert plain.mark("node-a", "GET", "/models") == b"node-a"
    assert plain.verify("anything", "GET", "/models")
    assert plain.balancer_mark() == "balancer"


def test_the_secret_comes_from_a_file_or_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("from-file\n")
    assert read_secret(str(path), {"TROUPE_CLUSTER_SECRET": "env"}) == b"from-file"
    assert read_secret(None, {"TROUPE_CLUSTER_SECRET": " env "}) == b"env"
    assert read_secret(None, {}) is None
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(UsageError, match="is empty"):
        read_secret(str(tmp_path / "empty"), {})
    with pytest.raises(UsageError, match="cannot read --cluster-secret-file"):
        read_secret(str(tmp_path / "missing"), {})


def test_node_routes_take_only_a_nodes_own_mark_and_never_without_a_secret() -> None:
    target = "/troupe/cluster/kv/fetch?model=m&ident=x&tenant=&better=0"
    mark = TRUST.mark("node-a", "POST", target, now=1000).decode()
    assert TRUST.verify(mark, "POST", target, now=1000, node_only=True)
    assert not TRUST.verify(TRUST.balancer_mark(), "POST", target, node_only=True)
    assert not TRUST.verify(mark, "POST", target + "x", now=1000, node_only=True)
    assert not ClusterTrust(None).verify("anything", "POST", target, node_only=True)


def test_a_seal_covers_what_it_names_and_needs_the_secret() -> None:
    seal = TRUST.seal("kv", "ident", "alice", "ab" * 32)
    assert TRUST.sealed(seal, "kv", "ident", "alice", "ab" * 32)
    assert not TRUST.sealed(seal, "kv", "ident", "bob", "ab" * 32)
    assert not ClusterTrust(b"other").sealed(seal, "kv", "ident", "alice", "ab" * 32)
    assert not ClusterTrust(None).sealed("", "kv", "ident", "alice", "ab" * 32)
