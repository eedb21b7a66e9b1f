"""What troupe ships: its modules import nothing of the test rig or the test tools, and the
built wheel holds troupe (the dashboard's static files included) and nothing else."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from email.parser import HeaderParser
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "troupe"

# Top-level modules that only the tests may load. Not listed, though test-only in spirit:
# numpy (gguf imports it), quart and hypercorn (quart-trio imports it), which are still
# runtime imports until the edge's rework decides their fate.
TEST_ONLY = {
    "troupe_rig",
    "pytest",
    "_pytest",
    "pytest_trio",
    "pytest_timeout",
    "hypothesis",
    "playwright",
    "openai",
    "mypy",
}

# Imports every module of troupe, then prints which ones it imported and every top-level
# module loaded. Rounds, not one pass: a module that only imports after another one (an
# import cycle entered from the wrong side) is retried once the rest are in.
IMPORT_ALL = """
import importlib, json, pkgutil, sys
import troupe
pending = sorted(
    info.name
    for info in pkgutil.walk_packages(troupe.__path__, "troupe.")
    if not info.name.endswith(".__main__")
)
while pending:
    failed = []
    for name in pending:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            failed.append(name)
            error = exc
    if len(failed) == len(pending):
        raise error
    pending = failed
print(json.dumps({
    "troupe": sorted(m for m in sys.modules if m == "troupe" or m.startswith("troupe.")),
    "top": sorted({m.split(".")[0] for m in sys.modules}),
}))
"""


def _module_names() -> set[str]:
    names = {"troupe"}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        names.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_every_runtime_module_imports_without_the_test_rig_or_test_tools(tmp_path: Path) -> None:
    # -I: no PYTHONPATH, no current directory on sys.path, so nothing of tests/ can leak in.
    done = subprocess.run(
        [sys.executable, "-I", "-c", IMPORT_ALL],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    assert set(loaded["troupe"]) >= _module_names()
    assert set(loaded["top"]) & TEST_ONLY == set()


def _build_wheel(tmp_path: Path) -> zipfile.ZipFile:
    """troupe's wheel, built offline from a copy of the tree: a stale build/ directory in the
    checkout (setuptools packs what it finds there) cannot add or hide anything."""
    tree = tmp_path / "tree"
    shutil.copytree(
        ROOT,
        tree,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "__pycache__", "*.egg-info", "build", "dist", "models", ".*_cache"
        ),
    )
    out = tmp_path / "wheel"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check"),
            *("--no-deps", "--no-build-isolation", "--no-index", "-w", str(out), str(tree)),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, f"pip wheel failed:\n{done.stdout}\n{done.stderr}"
    (wheel,) = out.glob("*.whl")
    return zipfile.ZipFile(wheel)


def test_the_wheel_holds_troupe_with_its_dashboard_and_no_test_rig(tmp_path: Path) -> None:
    with _build_wheel(tmp_path) as wheel:
        names = set(wheel.namelist())
        (metadata,) = (n for n in names if n.endswith(".dist-info/METADATA"))
        headers = HeaderParser().parsestr(wheel.read(metadata).decode())
    tops = {name.split("/")[0] for name in names}
    assert tops == {"troupe", metadata.split("/")[0]}
    assert not [n for n in names if "fake_engine" in n or "tiny_gguf" in n or "hub_http" in n]
    # Exactly the package's tree: every module, py.typed, the dashboard's static files.
    expected = {
        path.relative_to(PACKAGE.parent).as_posix()
        for path in PACKAGE.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert {"troupe/py.typed", "troupe/ops/static/index.html"} <= expected
    assert {n for n in names if n.startswith("troupe/")} == expected
    # Installed without extras, troupe pulls in no test tool and no direct numpy or hypercorn.
    requirements = [Requirement(r) for r in headers.get_all("Requires-Dist") or []]
    runtime = {canonicalize_name(r.name) for r in requirements if r.marker is None}
    assert "trio" in runtime
    assert runtime & {"numpy", "hypercorn", "pytest", "troupe-rig"} == set()
