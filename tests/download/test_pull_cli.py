"""``troupe pull``: a real process against the loopback hub (progress, Ctrl-C, resume)."""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import trio

from troupe.catalog.hfcache import cached_models
from troupe.download.journal import Journal
from troupe_rig.hub import Fault, Hub

MODEL = "m-Q4_K_M.gguf"


def pull_env(hub: Hub, tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HF_ENDPOINT")}
    return {
        **env,
        "MODEL_ENDPOINT": hub.url,
        "LLAMA_CACHE": str(tmp_path / "cache"),
        "TROUPE_STATE_DIR": str(tmp_path / "state"),
    }


def pull(hub: Hub, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "troupe", "pull", *args],
        env=pull_env(hub, tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if ln.startswith("troupe: error:")]
    return line


def test_pull_downloads_with_plain_progress_lines(hub: Hub, repo: str, tmp_path: Path) -> None:
    done = pull(hub, tmp_path, f"{repo}:Q4_K_M")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{repo}:Q4_K_M: 2 file(s), 2.6 MiB in ")
    lines = done.stderr.splitlines()
    assert lines[-1].startswith(f"{repo}:Q4_K_M: 100.0%  2.6 MiB / 2.6 MiB")
    assert "\r" not in done.stderr  # not a terminal: lines, no bar
    assert cached_models(tmp_path / "cache") == [f"{repo}:Q4_K_M"]
    assert huggingface_hub.scan_cache_dir(tmp_path / "cache").warnings == []


def test_pull_draws_a_bar_on_a_terminal(hub: Hub, repo: str, tmp_path: Path) -> None:
    main, sub = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "troupe", "pull", f"{repo}:Q8_0", "--no-mmproj"],
        env=pull_env(hub, tmp_path),
        stdin=subprocess.DEVNULL,
        stdout=sub,
        stderr=sub,
    )
    os.close(sub)
    out = b""
    try:
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: the process closed the terminal
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(main)
        assert proc.wait(timeout=60) == 0, out
    text = out.decode()
    assert "\r" in text
    assert f"{repo}:Q8_0 [" + "#" * 30 + "] 100.0%" in text
    assert "/s  ETA" in text


async def test_ctrl_c_keeps_the_bytes_and_a_second_pull_resumes(
    hub: Hub, repo: str, tiny_files: dict[str, Path], tmp_path: Path
) -> None:
    size = tiny_files[MODEL].stat().st_size
    hub.fault(repo, MODEL, Fault(stall_at=size // 2))
    name = f"{repo}:Q4_K_M"
    proc = await trio.lowlevel.open_process(
        [sys.executable, "-m", "troupe", "pull", name, "--no-mmproj"],
        env=pull_env(hub, tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    assert proc.stdout is not None
    seen = b""
    with trio.fail_after(30):
        while b"KiB / " not in seen:  # a progress line with bytes received
            chunk = await proc.stderr.receive_some(65536)
            assert chunk, seen
            seen += chunk
    proc.send_signal(signal.SIGINT)
    with trio.fail_after(10):
        code = await proc.wait()
    out = await proc.stdout.receive_some(65536)
    assert code == 130
    assert f"run `troupe pull {name}` again to resume" in out.decode()
    (entry,) = Journal(tmp_path / "state").entries()
    assert (entry.plan.name, entry.origin) == (name, "pull")
    (partial,) = (tmp_path / "cache").rglob("*.downloadInProgress")
    assert partial.stat().st_size == size // 2
    hub.fault(repo, MODEL, None)
    done = await trio.to_thread.run_sync(lambda: pull(hub, tmp_path, name))
    assert done.returncode == 0, done.stderr
    assert "resuming" in done.stderr
    assert hub.gets(MODEL)[-1].range == f"bytes={size // 2}-"
    assert Journal(tmp_path / "state").entries() == []
    assert cached_models(tmp_path / "cache") == [name]


def test_bad_input_is_one_line_and_a_non_zero_exit(hub: Hub, repo: str, tmp_path: Path) -> None:
    usage = pull(hub, tmp_path)
    assert usage.returncode == 2
    assert "usage: troupe pull" in one_line_error(usage)
    bad = pull(hub, tmp_path, "not-a-repo")
    assert bad.returncode == 2
    assert "invalid model 'not-a-repo'" in one_line_error(bad)
    missing = pull(hub, tmp_path, "org/missing")
    assert missing.returncode == 1
    assert "cannot download org/missing: org/missing: 404 Repository not found" in (
        one_line_error(missing)
    )
    tag = pull(hub, tmp_path, f"{repo}:Q2_K")
    assert tag.returncode == 1
    assert "no GGUF file with tag 'Q2_K'" in one_line_error(tag)
    flag = pull(hub, tmp_path, "--frobnicate", repo)
    assert flag.returncode == 2
    assert "unknown flag '--frobnicate'" in one_line_error(flag)
