"""The machine's cores from sysfs (a fake tree here, the real one in the e2e tests)."""

from __future__ import annotations

from pathlib import Path

from troupe.commands.doctor import cpu_lines
from troupe.hardware.cpus import format_cpus, parse_cpu_list, read_topology
from troupe.sched.cpu import CpuCore


def fake_sys(root: Path, cores: dict[int, tuple[int, int]], nodes: dict[int, str]) -> Path:
    """cpu -> (package, core id); node -> cpulist."""
    for cpu, (package, core) in cores.items():
        top = root / "cpu" / f"cpu{cpu}" / "topology"
        top.mkdir(parents=True)
        (top / "physical_package_id").write_text(f"{package}\n")
        (top / "core_id").write_text(f"{core}\n")
    for node, cpulist in nodes.items():
        d = root / "node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpulist + "\n")
    return root


def test_cpu_lists_round_trip() -> None:
    assert parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert format_cpus([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert parse_cpu_list("") == []


def test_smt_siblings_make_one_core_and_nodes_are_read(tmp_path: Path) -> None:
    # Two sockets of two cores, each core with two hyperthreads (Linux numbers the
    # siblings of cores 0-3 as CPUs 4-7).
    cores = {c: (c // 2 % 2, c % 2) for c in range(8)}
    sys = fake_sys(tmp_path, cores, {0: "0-1,4-5", 1: "2-3,6-7"})
    topology = read_topology(range(8), sys)
    assert topology is not None
    assert topology.cores == (
        CpuCore((0, 4), 0),
        CpuCore((1, 5), 0),
        CpuCore((2, 6), 1),
        CpuCore((3, 7), 1),
    )
    lines = cpu_lines(topology)
    assert "4 physical (CPUs 0-7; 4 with SMT siblings; NUMA nodes 0, 1)" in lines[0]
    assert "a child alone: all 4 cores; 2 at once: 2 each" in lines[1]


def test_only_the_allowed_cpus_count_and_an_unreadable_core_is_its_own(tmp_path: Path) -> None:
    sys = fake_sys(tmp_path, {0: (0, 0), 1: (0, 1)}, {})
    topology = read_topology([1, 3], sys)  # CPU 3 has no topology files
    assert topology is not None
    assert topology.cores == (CpuCore((1,), 0), CpuCore((3,), 0))
    assert read_topology([], sys) is None
