"""The PID ledger: orphans of a dead troupe are reaped; a live troupe's children never."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil

from troupe.child.ledger import PidLedger, reap_orphans


def sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )


def test_orphans_of_a_dead_owner_are_killed_and_the_file_removed(tmp_path: Path) -> None:
    child = sleeper()
    try:
        # A troupe that died: its pid is gone (the sleeper's parent pid is ours, so use a
        # pid with a create time that cannot match).
        dead_owner = {"pid": child.pid, "create_time": 1.0}
        entry = {
            "pid": child.pid,
            "create_time": round(psutil.Process(child.pid).create_time(), 2),
            "model": "m",
        }
        ledger_file = tmp_path / "children-999999.json"
        ledger_file.write_text(json.dumps({"owner": dead_owner, "children": [entry]}))
        assert reap_orphans(tmp_path) == [child.pid]
        assert child.wait(timeout=5) == -9
        assert not ledger_file.exists()
    finally:
        child.kill()
        child.wait()


def test_a_reused_pid_is_not_killed(tmp_path: Path) -> None:
    child = sleeper()
    try:
        entry = {"pid": child.pid, "create_time": 12345.0, "model": "m"}  # another process's pid
        (tmp_path / "children-1.json").write_text(
            json.dumps({"owner": {"pid": 1, "create_time": 1.0}, "children": [entry]})
        )
        assert reap_orphans(tmp_path) == []
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


def test_a_live_troupes_children_are_left_alone(tmp_path: Path) -> None:
    child = sleeper()
    ledger = PidLedger(tmp_path)
    try:
        ledger.add(child.pid, "m")  # this very process is the (live) owner
        assert reap_orphans(tmp_path) == []
        assert child.poll() is None
        ledger.remove(child.pid)
        assert json.loads(ledger.path.read_text())["children"] == []
    finally:
        ledger.close()
        child.kill()
        child.wait()
    assert not ledger.path.exists()


def test_garbage_files_are_ignored(tmp_path: Path) -> None:
    (tmp_path / "children-5.json").write_text("not json")
    assert reap_orphans(tmp_path) == []
    assert reap_orphans(tmp_path / "missing") == []
