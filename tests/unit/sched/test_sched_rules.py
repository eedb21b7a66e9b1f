"""The settle as ordered rules (sched/rules/): only the rules that are due run, and the
reason a request waits is the one the deciding rule recorded on its queue entry."""

from __future__ import annotations

import ast
from pathlib import Path

from schedcore_kit import Bench, grant_of, stops

import troupe.sched
from troupe.sched import ModelConfig, RestartKey
from troupe.sched.rules import RULES
from troupe.sched.verdicts import NO_SLOT, STOPPING


def test_every_rule_runs_once_per_settle_in_one_order() -> None:
    names = [rule.__name__ for rule in RULES]
    assert len(set(names)) == len(names)
    assert names.index("Waiters") < names.index("DirectLoads") < names.index("Evictions")
    assert names.index("StopDrained") < names.index("Evictions")  # its waiters counted


def test_a_release_on_a_loaded_model_with_nobody_waiting_runs_no_rule() -> None:
    b = Bench(models_max=2)
    b.bring_up("a")
    lease = b.lease("a")
    ran = b.core.settler.rules_run
    assert b.release(lease) == []
    again = b.rid()
    grant_of(b.acquire(again, "a"), again)
    b.release(again)
    assert b.core.settler.rules_run == ran


def test_the_last_release_of_a_drained_model_still_stops_it() -> None:
    b = Bench(models_max=1, drain_after=3.0)
    b.bring_up("a")
    lease = b.lease("a")
    wb = b.rid()
    assert b.acquire(wb, "b") == []
    assert b.view("b").wait_reason == NO_SLOT
    deadline = b.core.next_deadline()
    assert deadline is not None
    b.on_time(deadline)
    assert b.view("b").wait_reason == "waiting for a to finish its requests (swapped out for it)"
    (stop,) = stops(b.release(lease))
    assert stop.model == "a"


def test_reasons_are_the_deciding_rules_own() -> None:
    b = Bench(models_max=1)
    b.bring_up("a")
    wb, wc = b.rid(), b.rid()
    assert [s.model for s in stops(b.acquire(wb, "b"))] == ["a"]  # evicted for b
    b.acquire(wc, "c")
    assert b.view("b").wait_reason == STOPPING
    assert b.view("c").wait_reason == "in line behind b"
    b.exited("a")
    assert b.view("b").wait_reason == "loading"
    assert b.view("c").wait_reason == NO_SLOT  # b holds the only slot, still loading
    b.spawned("b")
    b.ready("b")
    assert b.view("b").wait_reason is None  # served: nobody waits for it


def test_a_request_waits_for_a_reload_and_says_so() -> None:
    b = Bench([ModelConfig("a", restart_key=RestartKey("1")), ModelConfig("b")], models_max=2)
    b.bring_up("a")
    b.core.reload(
        b.rid(), [ModelConfig("a", restart_key=RestartKey("2")), ModelConfig("b")], b.tick()
    )
    wb = b.rid()
    assert b.acquire(wb, "b") == []
    assert b.view("b").wait_reason == "waiting for a reload to finish"


# Where llama.cpp's `Status` may be read: the views that compute it for readers, the
# published view types, the events and effects that carry it out of the core, and the
# download table (whose own statuses are upstream's download states).
_STATUS_READERS = {"views.py", "status.py", "downloads.py", "events.py", "effects.py"}
_VIEW_TYPES = {"ModelView", "Snapshot"}  # in table.py


def _status_decisions(tree: ast.Module) -> list[tuple[int, str]]:
    """Each place ``tree`` decides on a `Status`: a ``.status`` read, a comparison or a
    match case naming `Status`, a field or parameter typed with it."""

    def names_status(node: ast.AST | None) -> bool:
        return node is not None and any(
            isinstance(n, ast.Name) and n.id == "Status" for n in ast.walk(node)
        )

    found: list[tuple[int, str]] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.ClassDef) and node.name in _VIEW_TYPES:
            continue
        todo.extend(ast.iter_child_nodes(node))
        if isinstance(node, ast.Attribute) and node.attr == "status":
            found.append((node.lineno, "reads .status"))
        elif isinstance(node, ast.Compare) and names_status(node):
            found.append((node.lineno, "compares a Status"))
        elif isinstance(node, ast.match_case) and names_status(node.pattern):
            found.append((node.pattern.lineno, "matches a Status"))
        elif isinstance(node, ast.AnnAssign | ast.arg) and names_status(node.annotation):
            found.append((node.lineno, "holds a Status"))
    return found


def test_no_decision_in_the_core_reads_the_display_status() -> None:
    """The core decides on the phase and the data beside it (`ModelState.announced`,
    `child_loading`, `restart`, `spawn_pending`...); llama.cpp's `Status` of a model is
    computed for readers only (`views.status_of`), and no part of the core keeps one."""
    root = Path(troupe.sched.__file__).parent
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.name in _STATUS_READERS and path.parent == root:
            continue
        for line, what in _status_decisions(ast.parse(path.read_text())):
            found.append(f"{path.relative_to(root)}:{line}: {what}")
    assert found == []


def test_the_status_scan_finds_each_way_of_deciding_on_a_status() -> None:
    """The scan above cannot pass for want of looking: each shape it forbids is found."""
    source = """
class ModelState:
    reported: Status
    def shown(self, m, s: Status):
        if m.status.is_running or self.reported is Status.LOADING:
            match s:
                case Status.LOADED:
                    pass
class ModelView:
    status: Status
    def api(self):
        return self.status is Status.LOADED
"""
    found = _status_decisions(ast.parse(source))
    assert sorted(found) == [
        (3, "holds a Status"),
        (4, "holds a Status"),
        (5, "compares a Status"),
        (5, "reads .status"),
        (7, "matches a Status"),
    ]
