"""The fleet view's pure parts: the Prometheus scrape configuration (checked by the real
``promtool``) and ``troupe cluster ps``'s rows."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from troupe.cluster.render import render_prometheus
from troupe.commands.cluster_ps import cluster_rows

PROMTOOL = shutil.which("promtool")


def test_one_target_per_node_with_its_name_and_the_key_from_a_file(tmp_path: Path) -> None:
    urls = ["http://10.0.0.1:8080", "http://10.0.0.2:8080", "https://10.0.0.3:8443"]
    key = tmp_path / "key"
    key.write_text("sk-x\n")
    text = render_prometheus(urls, key_file=str(key), ca_file="/etc/ca.pem", interval="5s")
    doc = yaml.safe_load(text)
    jobs = {job["job_name"]: job for job in doc["scrape_configs"]}
    assert sorted(jobs) == ["troupe-http", "troupe-https"]
    targets = [
        (target, group["labels"]["node"])
        for job in jobs.values()
        for group in job["static_configs"]
        for target in group["targets"]
    ]
    assert targets == [("10.0.0.1:8080", "n1"), ("10.0.0.2:8080", "n2"), ("10.0.0.3:8443", "n3")]
    for job in jobs.values():
        assert job["authorization"] == {"credentials_file": str(key)}
        assert job["honor_labels"] is True
        assert job["scrape_interval"] == "5s"
    assert jobs["troupe-https"]["tls_config"] == {"ca_file": "/etc/ca.pem"}
    assert "sk-x" not in text
    if PROMTOOL is None:
        pytest.skip("no promtool here")
    config = tmp_path / "prometheus.yml"
    config.write_text(text)
    checked = subprocess.run(
        [PROMTOOL, "check", "config", str(config)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_cluster_ps_rows_name_each_node_and_one_that_did_not_answer() -> None:
    loaded = {
        "id": "a",
        "status": {"value": "loaded"},
        "troupe": {"slots": 4, "in_flight": 3, "waiting": 1, "port": 1, "pid": 2},
    }
    idle = {"id": "b", "status": {"value": "unloaded"}, "troupe": {}}
    rows = cluster_rows({"http://h1:1": {"data": [loaded, idle]}, "http://h2:1": None})
    assert [(r["node"], r["name"], r["status"], r.get("slots")) for r in rows] == [
        ("n1", "a", "loaded", 4),
        ("n2", "-", "unreachable", None),
    ]
    assert (rows[0]["in_flight"], rows[0]["waiting"]) == (3, 1)
