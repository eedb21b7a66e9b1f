"""A lane as engine flags, and what a command line already says about its CPUs."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import trio

from troupe.child.cpu_flags import cpu_flags, cpu_request, parse_cpu_mask, parse_cpu_range
from troupe.child.process import pin, spawn_child
from troupe.sched.cpu import CpuPlan, CpuRequest


def test_a_lane_of_consecutive_cpus_is_a_range_and_a_scattered_one_a_mask() -> None:
    plan = CpuPlan(cores=(2, 3), cpus=(2, 3), threads=2)
    assert cpu_flags(plan, lambda _: False) == [
        "--threads", "2", "--threads-batch", "2", "--cpu-range", "2-3", "--cpu-strict", "1",
    ]  # fmt: skip
    scattered = CpuPlan(cores=(0, 2), cpus=(0, 5), threads=2)
    assert "--cpu-mask" in cpu_flags(scattered, lambda _: False)
    assert parse_cpu_mask(cpu_flags(scattered, lambda _: False)[5]) == (0, 5)


def test_a_shared_lane_does_not_poll_and_the_users_own_poll_is_kept() -> None:
    plan = CpuPlan(cores=(0,), cpus=(0,), threads=1, shared=True)
    assert cpu_flags(plan, lambda _: False)[-2:] == ["--poll", "0"]
    assert "--poll" not in cpu_flags(plan, lambda flag: flag == "--poll")


def test_the_command_lines_own_placement_is_read() -> None:
    flags = {"--threads": "3", "--cpu-range": "4-6"}
    assert cpu_request(flags.get) == CpuRequest(threads=3, cpus=(4, 5, 6))
    assert cpu_request({"--cpu-mask": "0x5"}.get) == CpuRequest(cpus=(0, 2))
    assert cpu_request({"--poll": "0"}.get) is None  # polling alone places nothing
    assert cpu_request({"--threads": "x"}.get) == CpuRequest()  # the engine will say why
    assert parse_cpu_range("3") == (3,)


# A child that starts a thread at once, before it is pinned from outside, then waits for
# a line and reports (policy, CPUs) of its first thread, that early one, and one after.
CHILD = (
    "import os, sys, threading\n"
    "seen = {}\n"
    "def look(name): seen[name] = (os.sched_getscheduler(0), sorted(os.sched_getaffinity(0)))\n"
    "go = threading.Event()\n"
    "def early(): go.wait(); look('early')\n"
    "t = threading.Thread(target=early); t.start()\n"
    "print('up', flush=True); sys.stdin.readline()\n"
    "go.set(); t.join(); look('main')\n"
    "t = threading.Thread(target=look, args=('later',)); t.start(); t.join()\n"
    "print(repr(sorted(seen.items())), flush=True)\n"
)


async def _report(proc: trio.Process, when_up: Callable[[], None] = lambda: None) -> str:
    assert proc.stdout is not None
    assert proc.stdin is not None
    out = b""
    while b"up\n" not in out:
        out += await proc.stdout.receive_some()
    when_up()
    await proc.stdin.send_all(b"go\n")
    while chunk := await proc.stdout.receive_some():
        out += chunk
    await proc.wait()
    return out.decode().removeprefix("up\n").strip()


async def test_a_child_is_pinned_on_its_cpus_every_thread_it_has_and_starts() -> None:
    # Pinned from outside once it runs (no Python code between fork and exec): the
    # thread it started before that is found in /proc/PID/task; a later one inherits.
    cpu = max(os.sched_getaffinity(0))
    proc = await spawn_child([sys.executable, "-c", CHILD], {}, cpus=[cpu])
    normal = os.sched_getscheduler(0)
    want = sorted((name, (normal, [cpu])) for name in ("early", "later", "main"))
    with trio.fail_after(30):
        assert await _report(proc) == repr(want)


async def test_background_work_runs_at_idle_priority_on_the_cores_it_is_given() -> None:
    # Pinned once its early thread surely runs: that thread is set through /proc.
    cpu = max(os.sched_getaffinity(0))
    proc = await spawn_child([sys.executable, "-c", CHILD], {})
    want = sorted((name, (os.SCHED_IDLE, [cpu])) for name in ("early", "later", "main"))
    with trio.fail_after(30):
        assert await _report(proc, lambda: pin(proc.pid, [cpu], idle=True)) == repr(want)
    pin(proc.pid, [cpu])  # gone: nothing to do, no error
