"""``troupe pull org/repo[:TAG]``: download a model into the HF cache, as the router would.

The same plan, transfer, verification and journal as ``POST /models``. A progress bar
(bytes, rate, ETA) on a terminal, a plain line at most every `PLAIN_EVERY` seconds
otherwise. Ctrl-C (SIGINT, or SIGTERM) pauses: what arrived stays on disk with its
journal entry, and the next ``pull`` of the same name resumes from there (the plan it
recorded, so the bytes on disk stay valid even if the branch moved). Exit status: 0
downloaded, 1 failed, 2 bad input, 130 interrupted.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

import trio

from troupe.catalog.facts import human_bytes
from troupe.catalog.hfcache import cache_dir, is_valid_repo_id, split_repo_tag
from troupe.child.ledger import default_state_dir
from troupe.download.hubapi import HubClient, HubError, hf_endpoint, hf_token, open_client
from troupe.download.job import DownloadJob, ProgressMap
from troupe.download.journal import Journal
from troupe.download.layout import RepoLayout
from troupe.download.plan import DownloadPlan, PlanError
from troupe.download.transfer import BusyError, ChecksumError
from troupe.errors import TroupeError, UsageError

__all__ = ["Progress", "run_pull"]

USAGE = "usage: troupe pull [--hf-token TOKEN] [--state-dir PATH] [--no-mmproj] org/repo[:TAG]"
PULL_HELP = f"""\
{USAGE}

Downloads a model from Hugging Face into its cache (where `troupe serve` finds
it, as llama.cpp does): the GGUF file for TAG (a quantisation such as Q4_K_M;
default: the repository's best), its split parts, and the repository's mmproj
when it has one. Size and sha256 are checked before the model is listed. A
pull cut short (Ctrl-C, a dropped connection) resumes where it stopped next
time.

  org/repo[:TAG]      the repository, and the file's tag
  --hf-token TOKEN    for gated or private repositories (default: $HF_TOKEN)
  --state-dir PATH    where the resume journal lives (default: troupe's state
                      directory, as `troupe serve --state-dir`)
  --no-mmproj         leave the multimodal projector out

The cache is $LLAMA_CACHE, else $HF_HUB_CACHE, else $HF_HOME/hub, else
~/.cache/huggingface/hub; the hub is $MODEL_ENDPOINT or $HF_ENDPOINT, else
https://huggingface.co.

example:
  troupe pull ggml-org/gemma-3-270m-it-GGUF:Q8_0"""
PLAIN_EVERY = 2.0
INTERRUPTED = 130


class Progress:
    """Renders a job's progress: a bar redrawn in place on a terminal, lines otherwise."""

    def __init__(
        self,
        name: str,
        out: TextIO,
        *,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.out = out
        self.tty = out.isatty() if tty is None else tty
        self.clock = clock
        self.start = clock()
        self.base: int | None = None  # bytes already on disk when this run began
        self.last_line = -math.inf
        self.done = self.total = 0
        self.printed = -1  # bytes shown by the last plain line

    def rate(self) -> float:
        elapsed = self.clock() - self.start
        return (self.done - (self.base or 0)) / elapsed if elapsed > 0 else 0.0

    def line(self) -> str:
        pct = 100.0 * self.done / self.total if self.total else 100.0
        rate = self.rate()
        left = (self.total - self.done) / rate if rate > 0 else math.inf
        eta = "--:--" if math.isinf(left) else f"{int(left // 60):02d}:{int(left % 60):02d}"
        sizes = f"{human_bytes(self.done)} / {human_bytes(self.total)}"
        return f"{pct:5.1f}%  {sizes}  {human_bytes(int(rate))}/s  ETA {eta}"

    async def update(self, progress: ProgressMap) -> None:
        self.done = sum(d for d, _ in progress.values())
        self.total = sum(t for _, t in progress.values())
        if self.base is None:
            self.base = self.done
        if self.tty:
            width = 30
            filled = int(width * self.done / self.total) if self.total else width
            bar = "#" * filled + "-" * (width - filled)
            self.out.write(f"\r{self.name} [{bar}] {self.line()}\x1b[K")
            self.out.flush()
        elif self.clock() - self.last_line >= PLAIN_EVERY or self.done == self.total:
            self._plain()

    def _plain(self) -> None:
        self.last_line = self.clock()
        self.printed = self.done
        print(f"{self.name}: {self.line()}", file=self.out, flush=True)

    async def tick(self) -> None:
        """Plain lines: one every `PLAIN_EVERY` seconds while bytes arrive, even when the
        reports that carried them came too soon after the last line."""
        while True:
            await trio.sleep(PLAIN_EVERY)
            if not self.tty and self.base is not None and self.done != self.printed:
                self._plain()

    def end(self) -> None:
        if self.tty:
            self.out.write("\n")
            self.out.flush()


def _parse(args: Sequence[str]) -> tuple[str, str | None, Path | None, bool]:
    name: str | None = None
    token: str | None = None
    state: Path | None = None
    mmproj = True
    it = iter(args)
    for arg in it:
        if arg in ("--hf-token", "-hft", "--state-dir"):
            value = next(it, None)
            if value is None:
                raise UsageError(f"flag '{arg}' needs a value")
            if arg == "--state-dir":
                state = Path(value)
            else:
                token = value
        elif arg == "--no-mmproj":
            mmproj = False
        elif arg.startswith("-"):
            raise UsageError(f"unknown flag '{arg}' ({USAGE})")
        elif name is not None:
            raise UsageError(f"one model at a time ({USAGE})")
        else:
            name = arg
    if not name:
        raise UsageError(USAGE)
    try:
        repo, _tag = split_repo_tag(name)
    except TroupeError:
        raise UsageError(f"invalid model '{name}': expected <user>/<model>[:quant]") from None
    if not is_valid_repo_id(repo):
        raise UsageError(f"invalid repository id '{repo}'")
    return name, token, state, mmproj


def run_pull(args: list[str]) -> int:
    if any(a in ("-h", "--help") for a in args):
        print(PULL_HELP)
        return 0
    name, token, state, mmproj = _parse(args)
    state_dir = state or default_state_dir()
    return trio.run(_pull, name, hf_token(os.environ, token), state_dir, mmproj)


async def _pull(name: str, token: str, state_dir: Path, mmproj: bool) -> int:
    cache = cache_dir(os.environ)
    endpoint = hf_endpoint(os.environ)
    journal = Journal(state_dir)
    progress = Progress(name, sys.stderr)
    interrupted = False
    plan: DownloadPlan | None = None
    failure: TroupeError | None = None
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def on_signal() -> None:
                nonlocal interrupted
                async for _ in signals:
                    interrupted = True
                    nursery.cancel_scope.cancel()
                    return

            nursery.start_soon(on_signal)
            nursery.start_soon(progress.tick)
            try:
                async with open_client(token, endpoint=endpoint) as client:
                    plan = await _plan(HubClient(client, endpoint), journal, name, cache, mmproj)
                    job = DownloadJob(
                        plan, cache, client, endpoint, journal=journal, origin="pull",
                        report=progress.update,
                    )  # fmt: skip
                    await job.run()
            except (HubError, PlanError, ChecksumError, BusyError) as exc:
                failure = TroupeError(f"cannot download {name}: {exc}")
            except OSError as exc:
                failure = TroupeError(f"cannot write {cache}: {exc}")
            nursery.cancel_scope.cancel()
    progress.end()
    if failure is not None:  # raised out here, not as an exception group
        raise failure
    if interrupted:
        kept = f"{human_bytes(progress.done)} of {human_bytes(progress.total)}"
        print(f"interrupted: {kept} kept; run `troupe pull {name}` again to resume")
        return INTERRUPTED
    assert plan is not None
    snapshot = RepoLayout(cache, plan.repo).root / "snapshots" / plan.commit
    print(f"{plan.listed_name}: {len(plan.files)} file(s), {human_bytes(plan.total)} in {snapshot}")
    return 0


async def _plan(
    hub: HubClient, journal: Journal, name: str, cache: Path, mmproj: bool
) -> DownloadPlan:
    """The plan an earlier ``pull`` of ``name`` recorded, to resume it; else a fresh one."""
    entry = journal.get(name)
    if entry is not None and entry.origin == "pull" and entry.cache == str(cache):
        print(f"resuming {name} at commit {entry.plan.commit[:12]}", file=sys.stderr)
        return entry.plan
    return await hub.plan(name, mmproj=mmproj)
