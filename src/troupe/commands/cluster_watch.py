"""``troupe cluster watch``: keep the balancer's configuration current.

    troupe cluster watch --nodes /etc/troupe/nodes.txt --bind :80 \\
        --out /etc/haproxy/haproxy.cfg --reload "systemctl reload haproxy"

Every ``--every`` seconds (default 10) it renders as ``troupe cluster render`` does,
reading the node list again (a fourth node is one line in ``nodes.txt``), and when the
configuration differs from ``--out``: checks it with ``haproxy -c`` (when HAProxy is on
the PATH; a refused one is reported and the file left alone), replaces the file
atomically and runs ``--reload`` (HAProxy's master-worker reload keeps every connection).
A node that does not answer keeps the catalog it last gave (its health checks already
take it out of service), so a node that blinks does not reload the balancer; a round in
which no node answers leaves the file alone. SIGTERM or Ctrl-C ends it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import FrameType
from typing import Any

from troupe.commands.cluster import USAGE, parse_render, render_config
from troupe.errors import UsageError

__all__ = ["run_watch"]


def _split(args: list[str]) -> tuple[Path, str | None, float, list[str]]:
    """Its own flags (``--out``, ``--reload``, ``--every``) and the render flags."""
    out: Path | None = None
    reload_cmd: str | None = None
    every = 10.0
    rest: list[str] = []
    i = 0
    while i < len(args):
        flag = args[i]
        if flag in ("--out", "--reload", "--every"):
            if i + 1 >= len(args):
                raise UsageError(f"flag '{flag}' needs a value\n{USAGE}")
            value = args[i + 1]
            if flag == "--out":
                out = Path(value)
            elif flag == "--reload":
                reload_cmd = value
            else:
                try:
                    every = float(value.removesuffix("s"))
                except ValueError:
                    every = 0.0
                if every <= 0:
                    raise UsageError(f"invalid value for --every: '{value}' (seconds)")
            i += 2
        else:
            rest.append(flag)
            i += 1
    if out is None:
        raise UsageError(f"troupe cluster watch needs --out FILE\n{USAGE}")
    if not out.parent.is_dir():
        raise UsageError(f"--out '{out}': no directory {out.parent}")
    return out, reload_cmd, every, rest


def _say(line: str) -> None:
    print(f"troupe: {line}", flush=True)


def _checked(tmp: Path) -> str | None:
    """None when HAProxy accepts the file (or is not here to ask), else why not."""
    haproxy = shutil.which("haproxy")
    if haproxy is None:
        return None
    done = subprocess.run(
        [haproxy, "-c", "-q", "-f", str(tmp)], capture_output=True, text=True, check=False
    )
    if done.returncode == 0:
        return None
    lines = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
    return lines[0] if lines else f"haproxy -c exited {done.returncode}"


class _Watch:
    def __init__(self, out: Path, reload_cmd: str | None, rest: list[str]) -> None:
        self.out = out
        self.reload_cmd = reload_cmd
        self.rest = rest
        self.known: dict[str, Mapping[str, Any]] = {}
        self.current = out.read_text(encoding="utf-8") if out.is_file() else None
        self.refused: str | None = None  # a text HAProxy refused: not tried again
        self.answered: set[str] = set()  # the nodes that answered this round
        self.silent: set[str] = set()  # the nodes said not to answer

    def round(self) -> None:
        try:
            urls, options, key, _ = parse_render(self.rest)
        except UsageError as exc:  # e.g. the node list being rewritten: next round
            _say(f"warning: {exc}".splitlines()[0])
            return
        before = dict(self.known)
        rendered = render_config(urls, options, key, self.known, self.answered)
        for url in urls:  # a line when a node stops answering and when it is back
            if url in self.answered and url in self.silent:
                self.silent.discard(url)
                _say(f"{url} answers again")
            elif url not in self.answered and url not in self.silent:
                self.silent.add(url)
                kept = " (its last catalog kept)" if url in before else ""
                _say(f"warning: {url} does not answer GET /models{kept}")
        if rendered is None:
            _say(f"warning: no node answered GET /models: {self.out} left as it is")
            return
        text, placement = rendered
        if text in (self.current, self.refused):
            return
        tmp = self.out.with_name(f".{self.out.name}.{os.getpid()}.tmp")
        tmp.write_text(text, encoding="utf-8")
        why = _checked(tmp)
        if why is not None:
            tmp.unlink(missing_ok=True)
            self.refused = text
            _say(f"error: haproxy refuses the new configuration ({why}): {self.out} kept")
            return
        os.replace(tmp, self.out)
        self.current, self.refused = text, None
        models = len(placement.models())
        _say(f"wrote {self.out}: {len(urls)} nodes, {models} models")
        if self.reload_cmd:
            done = subprocess.run(self.reload_cmd, shell=True, check=False)
            if done.returncode == 0:
                _say(f"reloaded: {self.reload_cmd}")
            else:
                _say(f"error: '{self.reload_cmd}' exited {done.returncode}")


def _stop(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def run_watch(args: list[str]) -> int:
    out, reload_cmd, every, rest = _split(args)
    parse_render(rest)  # the render flags' mistakes at the door, once
    watch = _Watch(out, reload_cmd, rest)
    signal.signal(signal.SIGTERM, _stop)
    try:
        while True:
            watch.round()
            time.sleep(every)
    except KeyboardInterrupt:
        return 0
    finally:
        sys.stdout.flush()
