"""``troupe import PATH``: put a local GGUF (and its mmproj) into a ``--models-dir``.

As Jan's import, after validating:

* the file is a GGUF whose header reads and whose tensor data lies inside the file
  (a truncated download is refused here, not at load);
* it is a model, not a lone CLIP projector (an mmproj is imported *with* its model);
* the name (``--name``, default the file name without ``.gguf`` and shard suffix) is
  one path segment of ``[A-Za-z0-9_.-]``, no ``.``/``..``, no leading dot: it can never
  climb out of the models directory, and the models-dir scan (one level deep) finds it.

A single file becomes ``<models-dir>/<name>.gguf``; a model with an mmproj (``--mmproj``,
or an ``mmproj`` GGUF beside it) or split in shards becomes ``<models-dir>/<name>/``,
the layout the scan reads as one model. Files are copied (to a temporary name, then
renamed: a reader never sees half a file) or, with ``--link``, symlinked to the
original's absolute path (Jan's in-place import). Nothing that exists is overwritten.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

import attrs

from troupe.catalog.facts import human_bytes
from troupe.catalog.hfcache import find_best_mmproj, split_info
from troupe.catalog.modelsdir import is_draft_file, is_mmproj_file
from troupe.errors import TroupeError, UsageError
from troupe.gguf import GGUFError, read_header
from troupe.gguf.capabilities import main_model_rejection
from troupe.gguf.facts import shard_paths

__all__ = ["ImportPlan", "plan_import", "run_import", "valid_name"]

USAGE = "usage: troupe import PATH [--models-dir DIR] [--name NAME] [--mmproj FILE] [--link]"
HELP = f"""{USAGE}

Copies (or with --link, symlinks) a local GGUF model, and its mmproj if one lies beside
it, into a models directory (default: $LLAMA_ARG_MODELS_DIR), after checking that it
is a readable GGUF model and not a lone projector."""
_NAME = re.compile(r"[A-Za-z0-9_.-]+\Z")
_MAGIC = b"GGUF"


@attrs.frozen
class _Sidecar:
    path: str  # for find_best_mmproj: the name, relative to the model's directory
    file: Path


@attrs.frozen
class ImportPlan:
    name: str
    files: tuple[tuple[Path, Path], ...]  # (source, destination)
    link: bool


def valid_name(name: str) -> str | None:
    """Why ``name`` cannot name an imported model, or None."""
    if not _NAME.match(name):
        return "only letters, digits and _ . - are allowed (one path segment)"
    if name in (".", "..") or name.startswith("."):
        return "it may not start with a dot"
    if is_mmproj_file(name) or is_draft_file(name):
        return "a name with 'mmproj' or a draft prefix would be skipped by the models-dir scan"
    return None


def _check_gguf(path: Path, what: str) -> str:
    """The file's ``general.architecture``; TroupeError when it is not a readable GGUF."""
    if not path.is_file():
        raise TroupeError(f"{what} {path}: no such file")
    try:
        with path.open("rb") as f:
            magic = f.read(4)
    except OSError as exc:
        raise TroupeError(f"{what} {path}: cannot read: {exc.strerror or exc}") from None
    if magic != _MAGIC:
        raise TroupeError(f"{what} {path}: not a GGUF file (no GGUF magic)")
    try:
        header = read_header(path, check_data=True)
    except GGUFError as exc:
        raise TroupeError(f"{what} {exc}") from None
    return header.get_str("general.architecture") or "?"


def _find_mmproj(model: Path) -> Path | None:
    siblings = [
        _Sidecar(p.name, p)
        for p in sorted(model.parent.glob("*.gguf"))
        if is_mmproj_file(p.name) and p != model
    ]
    best = find_best_mmproj(siblings, model.name)
    return best.file if best is not None else None


def plan_import(
    source: Path, models_dir: Path, *, name: str | None, mmproj: Path | None, link: bool
) -> ImportPlan:
    """What ``troupe import`` will write; TroupeError for anything it refuses."""
    arch = _check_gguf(source, "model")  # the file named first: the likelier mistake
    if not models_dir.is_dir():
        raise TroupeError(f"--models-dir {models_dir}: does not exist or is not a directory")
    if (why := main_model_rejection(arch)) is not None:
        raise TroupeError(f"{source}: {why}; import its model with --mmproj {source.name}")
    split = split_info(source.name)
    if split.count > 1 and split.index != 1:
        raise TroupeError(f"{source}: shard {split.index} of {split.count}: import the first")
    shards = [source]
    if split.count > 1:
        shards = [Path(p) for p in shard_paths(source, split.count)]
        for shard in shards[1:]:
            _check_gguf(shard, "shard")
    name = name or (split.prefix if split.count > 1 else source.name.replace(".gguf", ""))
    if (why := valid_name(name)) is not None:
        raise TroupeError(f"invalid model name '{name}': {why} (choose one with --name)")
    projector = mmproj or _find_mmproj(source)
    if projector is not None and _check_gguf(projector, "mmproj") != "clip":
        raise TroupeError(f"mmproj {projector}: not a CLIP projector (architecture is not clip)")
    if projector is None and len(shards) == 1:
        files = [(source, models_dir / f"{name}.gguf")]
    else:
        if any(is_mmproj_file(s.name) for s in shards):
            raise TroupeError(f"{source}: a model file named like an mmproj cannot share a folder")
        folder = models_dir / name
        files = [(s, folder / s.name) for s in shards]
        if projector is not None:
            files.append((projector, folder / projector.name))
    for _, dest in files:
        target = dest.parent if dest.parent != models_dir else dest
        if target.exists() or target.is_symlink():
            raise TroupeError(f"{target} already exists: remove it first, or choose another --name")
    return ImportPlan(name, tuple(files), link)


def apply_import(plan: ImportPlan) -> None:
    made: list[Path] = []
    try:
        for src, dest in plan.files:
            if not dest.parent.exists():
                dest.parent.mkdir()
                made.append(dest.parent)
            tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
            if plan.link:
                tmp.symlink_to(src.resolve())
            else:
                shutil.copyfile(src, tmp)
            os.replace(tmp, dest)
            made.append(dest)
    except BaseException:
        for path in reversed(made):  # leave nothing half-imported
            with contextlib.suppress(OSError):
                if path.is_dir() and not path.is_symlink():
                    path.rmdir()
                else:
                    path.unlink()
        raise


def _parse(args: Sequence[str]) -> tuple[Path, Path, str | None, Path | None, bool]:
    values: dict[str, str] = {}
    link = False
    paths: list[str] = []
    it = iter(args)
    for arg in it:
        if arg in ("--models-dir", "--name", "--mmproj"):
            value = next(it, None)
            if value is None:
                raise UsageError(f"flag '{arg}' needs a value")
            values[arg] = value
        elif arg == "--link":
            link = True
        elif arg.startswith("-"):
            raise UsageError(f"unknown flag '{arg}' ({USAGE})")
        else:
            paths.append(arg)
    if len(paths) != 1:
        raise UsageError(USAGE)
    models_dir = values.get("--models-dir") or os.environ.get("LLAMA_ARG_MODELS_DIR")
    if not models_dir:
        raise UsageError("where to? give --models-dir DIR (or set LLAMA_ARG_MODELS_DIR)")
    mmproj = Path(values["--mmproj"]) if "--mmproj" in values else None
    return Path(paths[0]), Path(models_dir), values.get("--name"), mmproj, link


def run_import(args: list[str]) -> int:
    if any(a in ("-h", "--help") for a in args):
        print(HELP)
        return 0
    source, models_dir, name, mmproj, link = _parse(args)
    plan = plan_import(source, models_dir, name=name, mmproj=mmproj, link=link)
    try:
        apply_import(plan)
    except OSError as exc:
        raise TroupeError(f"cannot import into {models_dir}: {exc.strerror or exc}") from None
    size = sum(src.stat().st_size for src, _ in plan.files)
    how = "linked" if link else "copied"
    where = plan.files[0][1] if len(plan.files) == 1 else plan.files[0][1].parent
    print(f"imported {plan.name}: {len(plan.files)} file(s), {human_bytes(size)} {how} to {where}")
    print(f"serve it with: troupe serve --models-dir {models_dir}", file=sys.stderr)
    return 0
