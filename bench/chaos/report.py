"""Output: one line per scenario (and router), a side-by-side table, the totals."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from chaos.runner import Result

WIDTH = 48  # one column of the side-by-side table


def _figures(result: Result) -> str:
    return " ".join(f"{k}={v}" for k, v in result.figures.items())


def print_line(result: Result, *, prefix: bool) -> None:
    head = f"{result.router:<12} " if prefix else ""
    took = f"{result.seconds:5.1f}s" if result.seconds else "     -"
    line = f"{head}{result.scenario:<20} {result.verdict:<4} {took}  {_figures(result)}"
    if result.failures:
        line += "  | " + "; ".join(result.failures)
    print(line, flush=True)


def _cell(result: Result | None) -> str:
    if result is None:
        return "-"
    if result.verdict == "FAIL":
        text = f"FAIL {result.failures[0]}"
    elif result.verdict == "n/a":
        text = "n/a (fake engine)"
    else:
        text = f"PASS {_figures(result)}"
    return text if len(text) <= WIDTH else text[: WIDTH - 3] + "..."


def print_side_by_side(results: list[Result], kinds: list[str]) -> None:
    by = {(r.scenario, r.router): r for r in results}
    names = list(dict.fromkeys(r.scenario for r in results))
    print()
    print(f"{'scenario':<20} " + " ".join(f"{k:<{WIDTH}}" for k in kinds).rstrip())
    for name in names:
        cells = [_cell(by.get((name, k))) for k in kinds]
        print(f"{name:<20} " + " ".join(f"{c:<{WIDTH}}" for c in cells).rstrip())
    for kind in kinds:
        mine = [r for r in results if r.router == kind]
        passed = sum(r.verdict == "PASS" for r in mine)
        failed = sum(r.verdict == "FAIL" for r in mine)
        na = sum(r.verdict == "n/a" for r in mine)
        print(f"{kind}: {passed} passed, {failed} failed, {na} n/a")


def print_totals(results: list[Result]) -> int:
    """The last line; the exit status (1 when anything failed)."""
    passed = sum(r.verdict == "PASS" for r in results)
    failed = sum(r.verdict == "FAIL" for r in results)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0
