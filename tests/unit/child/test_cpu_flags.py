"""A lane as engine flags, and what a command line already says about its CPUs."""

from __future__ import annotations

import os
import subprocess
import sys

from troupe.child.cpu_flags import cpu_flags, cpu_request, parse_cpu_mask, parse_cpu_range
from troupe.child.process import placed, spawn_child, to_background
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


async def test_a_child_is_on_its_cpus_from_its_first_instruction() -> None:
    # The child reads its own mask at once: pinning the pid after the spawn came too
    # late for threads the engine had started by then.
    cpu = max(os.sched_getaffinity(0))
    proc = await spawn_child(["grep", "Cpus_allowed_list", "/proc/self/status"], {}, cpus=[cpu])
    assert proc.stdout is not None
    out = b""
    while chunk := await proc.stdout.receive_some():
        out += chunk
    await proc.wait()
    assert out.decode().split(":")[1].strip() == str(cpu)


def test_background_work_runs_at_idle_priority_on_the_cores_it_is_given() -> None:
    # Set from outside once it runs, on the thread it had then and on one it starts
    # after (which inherits): no Python code between fork and exec.
    cpu = max(os.sched_getaffinity(0))
    code = (
        "import os, sys, threading\n"
        "sys.stdin.readline()\n"
        "seen = []\n"
        "def look(): seen.append((os.sched_getscheduler(0), os.sched_getaffinity(0)))\n"
        "look(); t = threading.Thread(target=look); t.start(); t.join()\n"
        "print(repr(seen), end='')\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    ) as proc:
        to_background(proc.pid, [cpu])
        out, _ = proc.communicate(b"go\n", timeout=30)
    assert out.decode() == repr([(os.SCHED_IDLE, {cpu})] * 2)
    assert placed(None) is None  # nothing to place: nothing runs before exec
    to_background(proc.pid, [cpu])  # gone: nothing to do, no error
