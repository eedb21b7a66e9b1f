"""The README is a front page and docs/ the reference: every relative link in them
reaches a file (and a heading, when it names one), the README stays short, and it
shows the test command CI runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FRONT_PAGE_LIMIT = 10 * 1024  # bytes; the reference lives in docs/

_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def _links(text: str) -> list[str]:
    return _LINK.findall(_FENCE.sub("", text))


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = _FENCE.sub("", path.read_text())
    return {_slug(m) for m in re.findall(r"^#+\s+(.*)$", text, re.M)}


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` that reach no file, or no heading of it."""
    broken = []
    for target in _links(page.read_text()):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        path = (page.parent / path_part).resolve() if path_part else page
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
            broken.append(f"{target}: no heading '#{anchor}' in {path.name}")
    return broken


def test_the_link_checker_finds_a_broken_link(tmp_path: Path) -> None:
    (tmp_path / "there.md").write_text("# A heading\n")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](there.md) [ok](there.md#a-heading) [web](https://example.com/x.md)\n"
        "[gone](missing.md) [no](there.md#elsewhere)\n```\n[in code](ignored.md)\n```\n"
    )
    assert broken_links(page) == [
        "missing.md: no such file",
        "there.md#elsewhere: no heading '#elsewhere' in there.md",
    ]


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_reaches_its_file(page: Path) -> None:
    assert broken_links(page) == []


def test_every_docs_page_is_linked_from_the_index() -> None:
    index = ROOT / "docs" / "README.md"
    linked = {Path(t.partition("#")[0]).name for t in _links(index.read_text())}
    pages = {p.name for p in PAGES if p.parent.name == "docs" and p != index}
    assert pages <= linked, f"docs/README.md does not link {sorted(pages - linked)}"


def test_the_readme_is_a_front_page() -> None:
    size = len((ROOT / "README.md").read_bytes())
    assert size < FRONT_PAGE_LIMIT, f"README.md is {size} bytes: move reference to docs/"


def test_the_readme_shows_the_command_ci_runs() -> None:
    """``.ci/run`` runs the README's test command: the two must not drift apart."""
    run = (ROOT / ".ci" / "run").read_text()
    (command,) = re.findall(r"^exec (.+)$", run, re.M)
    blocks = re.findall(r"^```sh\n(.*?)^```", (ROOT / "README.md").read_text(), re.S | re.M)
    assert any(command in block.splitlines() for block in blocks), command
    assert (ROOT / command.split()[0]).is_file()
