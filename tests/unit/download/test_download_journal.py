"""The unfinished-downloads journal: what survives a restart, and what is cleaned."""

from __future__ import annotations

import json
from pathlib import Path

from troupe.download.journal import Journal, plan_from_json, plan_to_json
from troupe.download.plan import DownloadPlan, PlannedFile


def a_plan(name: str = "o/r:Q8_0") -> DownloadPlan:
    files = (
        PlannedFile("m-Q8_0.gguf", 100, "a" * 64, "a" * 64, "b" * 40, "model"),
        PlannedFile("mmproj-F16.gguf", 50, "c" * 64, "c" * 64, "d" * 40, "mmproj"),
    )
    return DownloadPlan(name, "o/r", "Q8_0", "main", "e" * 40, files)


def test_a_plan_round_trips_through_json() -> None:
    plan = a_plan()
    assert plan_from_json(json.loads(json.dumps(plan_to_json(plan)))) == plan


def test_entries_survive_a_new_journal_object_and_go_when_removed(tmp_path: Path) -> None:
    Journal(tmp_path).add(a_plan(), "router", tmp_path / "cache")
    Journal(tmp_path).add(a_plan("o/r"), "pull", tmp_path / "cache")
    again = Journal(tmp_path)
    entries = {e.plan.name: e for e in again.entries()}
    assert set(entries) == {"o/r:Q8_0", "o/r"}
    assert entries["o/r:Q8_0"].plan == a_plan()
    assert (entries["o/r:Q8_0"].origin, entries["o/r"].origin) == ("router", "pull")
    assert entries["o/r"].cache == str(tmp_path / "cache")
    again.remove("o/r:Q8_0")
    assert [e.plan.name for e in Journal(tmp_path).entries()] == ["o/r"]
    assert Journal(tmp_path).get("o/r:Q8_0") is None


def test_malformed_entries_are_cleaned_and_a_broken_file_is_ignored(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    journal.add(a_plan(), "router", tmp_path)
    data = json.loads(journal.path.read_text())
    data["downloads"]["junk"] = {"plan": {"name": "x"}, "origin": "router"}
    journal.path.write_text(json.dumps(data))
    assert [e.plan.name for e in journal.entries()] == ["o/r:Q8_0"]
    assert journal.clean() == ["junk"]
    assert set(json.loads(journal.path.read_text())["downloads"]) == {"o/r:Q8_0"}
    journal.path.write_text("{not json")
    assert journal.entries() == []
    journal.add(a_plan(), "router", tmp_path)  # a broken file is replaced, not a crash
    assert len(journal.entries()) == 1
