"""Remote presets: ``troupe serve -hf org/repo`` on a repo with ``preset.ini`` at its root.

As llama.cpp's router: the hub's file list is read (``refs``, then the
``tree`` of that commit); if it holds ``preset.ini`` at its root, only that file is
downloaded (through the same job as every download: verified, into the HF cache) and
the process becomes a router over it, with the model fields cleared. Offline, or when
the hub cannot be reached, the cached snapshot is looked at instead, as upstream falls
back to its cached files. Anything else (no preset in the repo) is a model: the engine
runs it directly.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import trio

from troupe.catalog.hfcache import cache_dir, cached_files, is_valid_repo_id, split_repo_tag
from troupe.download.hubapi import HubClient, HubError, hf_endpoint, open_client
from troupe.download.job import DownloadJob
from troupe.download.layout import RepoLayout
from troupe.download.plan import make_plan

__all__ = ["PRESET_FILE", "fetch_remote_preset", "warn_remote_preset"]

log = logging.getLogger("troupe")

PRESET_FILE = "preset.ini"


def fetch_remote_preset(
    hf_repo: str, environ: Mapping[str, str], token: str, *, offline: bool = False
) -> Path | None:
    """The local path of ``hf_repo``'s ``preset.ini`` (downloaded if need be), or None
    when the repository is not a preset repository (or cannot be read)."""
    try:
        repo, _tag = split_repo_tag(hf_repo)
    except Exception:  # a malformed name: let the engine say so, as it would
        return None
    if not is_valid_repo_id(repo):
        return None
    cache = cache_dir(environ)
    if not offline:
        try:
            return trio.run(_download, repo, hf_repo, cache, hf_endpoint(environ), token)
        except HubError as exc:
            log.warning("cannot read %s from the hub (%s): looking in the cache", repo, exc)
        except OSError as exc:
            log.warning("cannot download %s/%s: %s", repo, PRESET_FILE, exc)
    cached = next((f for f in cached_files(cache, repo) if f.path == PRESET_FILE), None)
    return cached.local_path if cached is not None else None


async def _download(repo: str, name: str, cache: Path, endpoint: str, token: str) -> Path | None:
    async with open_client(token, endpoint=endpoint) as client:
        hub = HubClient(client, endpoint)
        branch, commit = await hub.commit(repo)
        files = await hub.tree(repo, commit)
        if not any(f.path == PRESET_FILE for f in files):
            return None
        plan = make_plan(name, repo, "", branch, commit, files)
        await DownloadJob(plan, cache, client, endpoint).run()
        return RepoLayout(cache, repo).snapshot(commit, plan.files[0])


def warn_remote_preset(hf_repo: str) -> None:
    """Upstream's warning, word for word."""
    log.warning("NOTE: using preset.ini from HF repo '%s'", hf_repo)
    log.warning("      please only use presets that you can trust! Unknown presets may be unsafe")
