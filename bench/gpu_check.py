"""The check on a real NVIDIA card: one prepared script that fits in 10 minutes on a
lent H100/H200 (no package registry there: troupe's wheels travel with it, see
`bench/gpu_wheels.sh`, and the engine is built there from the pinned sdist).

    scripts/engine-cuda                      # or --engine PATH below
    PYTHONPATH=/tmp/site:src:tests/support python3 bench/gpu_check.py [--engine PATH]
        [--out DIR] [--layers N] [--embd N] [--no-build]

What it prints, each figure with what it is compared with:

1. the engine: the CUDA build (`scripts/engine-cuda`, its time) and `--list-devices`;
2. **projection vs NVML**: troupe serves model ``g-a``; the need ``/models`` admits it
   by (the engine's own projection) beside what NVML says its child holds (by PID;
   goal: within 10%);
3. **eviction for VRAM**: ``--models-memory-margin`` set so that the card holds one of
   ``g-a``/``g-b`` and not both: asking for ``g-b`` evicts ``g-a`` (no ``--models-max``);
4. **a load that does not fit**: ``g-a`` at a context whose KV cache is larger than the
   card, ``--fit off``, memory admission off: the child's CUDA out-of-memory must be
   classified as OOM (``last_error``);
5. **tokens/s** through troupe vs the engine started alone with the same flags (goal:
   >= 0.95x);
6. **a swap** at ``--models-max 1`` through troupe vs llama.cpp's router (the same binary
   without ``-m``), alternating ``g-a`` and ``g-b``: median request time of a swap.

Without a GPU (``--engine`` a CPU build) steps 2-4 say "no GPU" and the rest runs: how
the script itself is checked on a machine without a card.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _util import http_json, serving
from troupe_rig import TinyModel, write_tiny_models
from troupe_rig.engine_process import free_port

ROOT = Path(__file__).resolve().parents[1]
CTX = 4096


def say(line: str) -> None:
    print(line, flush=True)


def nvidia_smi(*query: str) -> list[list[str]]:
    """Rows of ``nvidia-smi --query-...`` (empty without a driver)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", *query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line]


def gpu_free_mib() -> int | None:
    rows = nvidia_smi("--query-gpu=memory.free")
    return int(rows[0][0]) if rows else None


def child_mib(pid: int) -> int | None:
    """What NVML says process ``pid`` holds on the GPU (MiB)."""
    for row in nvidia_smi("--query-compute-apps=pid,used_memory"):
        if row and row[0] == str(pid):
            return int(row[1])
    return None


def build_engine(skip: bool) -> tuple[Path, float | None]:
    built = ROOT / ".venv" / "engines" / "cuda" / "llama-server"
    if skip or built.exists():
        return built, None
    started = time.monotonic()
    subprocess.run([str(ROOT / "scripts" / "engine-cuda")], check=True)
    return built, time.monotonic() - started


def models(directory: Path, layers: int, embd: int) -> None:
    """Two models big enough for the card to do real work (f16, ~14 * layers * embd^2
    bytes each), written here: no model travels."""
    spec = {"n_layer": layers, "n_embd": embd, "n_head": 16, "n_head_kv": 8, "n_ff": 3 * embd}
    write_tiny_models(
        directory,
        [TinyModel("g-a", seed=1, n_ctx=CTX, **spec), TinyModel("g-b", seed=2, n_ctx=CTX, **spec)],
    )


def troupe(engine: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "troupe", "serve", "--engine", str(engine), "--port", "0", *args]


def listed(url: str) -> dict[str, dict[str, Any]]:
    _, doc = http_json(url + "/models")
    assert isinstance(doc, dict)
    return {m["id"]: m for m in doc["data"]}


def complete(url: str, model: str, tokens: int = 16) -> dict[str, Any]:
    body = {"model": model, "prompt": "hello", "n_predict": tokens, "ignore_eos": True}
    status, doc = http_json(url + "/completion", body, timeout=300)
    if status != 200 or not isinstance(doc, dict):
        raise RuntimeError(f"{model}: {status} {doc}")
    return doc


def step_projection(engine: Path, mdir: Path, logs: Path, gpu: bool) -> dict[str, Any]:
    with serving("troupe", troupe(engine, "--models-dir", str(mdir), "-c", str(CTX)), logs) as url:
        complete(url, "g-a")
        item = listed(url)["g-a"]
        need = item["troupe"]["memory"]["need_bytes"] if item["troupe"].get("memory") else {}
        pid = item["troupe"]["pid"]
        held = child_mib(pid) if gpu else None
    projected = sum(v for k, v in need.items() if k != "host") >> 20 if need else None
    say(f"projection vs NVML: need {need} (device part {projected} MiB), NVML {held} MiB")
    ratio = held / projected if held and projected else None
    if ratio is not None:
        say(f"  NVML / projection = {ratio:.3f} (goal: 0.90-1.10)")
    return {"need_bytes": need, "nvml_mib": held, "ratio": ratio}


def step_eviction(engine: Path, mdir: Path, logs: Path, gpu: bool) -> dict[str, Any]:
    free = gpu_free_mib() if gpu else None
    if free is None:
        say("eviction for VRAM: no GPU")
        return {}
    with serving("probe", troupe(engine, "--models-dir", str(mdir), "-c", str(CTX)), logs) as url:
        complete(url, "g-a")
        need = listed(url)["g-a"]["troupe"]["memory"]["need_bytes"]
    one = sum(v for k, v in need.items() if k != "host") >> 20
    margin = max(0, free - one - one // 2)  # room for one model and a half: never two
    args = ["--models-dir", str(mdir), "-c", str(CTX), "--models-memory-margin", str(margin)]
    with serving("troupe-margin", troupe(engine, *args), logs) as url:
        complete(url, "g-a")
        started = time.monotonic()
        complete(url, "g-b")
        took = time.monotonic() - started
        state = {m: v["status"]["value"] for m, v in listed(url).items()}
        why = listed(url)["g-a"]["troupe"].get("last_eviction")
    ok = state.get("g-a") == "unloaded" and state.get("g-b") == "loaded"
    say(f"eviction for VRAM: free {free} MiB, one model {one} MiB, margin {margin} MiB:")
    say(f"  after g-b: {state} ({'evicted g-a' if ok else 'NOT as expected'}), {took:.2f} s;")
    say(f"  g-a's last eviction: {why}")
    return {"free_mib": free, "one_mib": one, "margin_mib": margin, "ok": ok, "seconds": took}


def step_oom(engine: Path, mdir: Path, logs: Path, gpu: bool) -> dict[str, Any]:
    free = gpu_free_mib() if gpu else None
    if free is None:
        say("a load that does not fit: no GPU")
        return {}
    # KV per token: 2 (K and V) * layers * kv heads * head dim * 2 bytes (f16).
    preset = mdir / "oom.ini"
    ctx = 1 << 22  # 4M tokens: a KV cache far larger than any card
    preset.write_text(f"[g-huge]\nmodel = {mdir / 'g-a.gguf'}\nctx-size = {ctx}\nfit = off\n")
    args = ["--models-preset", str(preset), "--models-memory-margin", "off"]
    with serving("troupe-oom", troupe(engine, *args), logs) as url:
        status, doc = http_json(
            url + "/completion", {"model": "g-huge", "prompt": "x", "n_predict": 1}, timeout=300
        )
        error = listed(url)["g-huge"]["troupe"].get("last_error")
    oom = "out of memory" in json.dumps(doc).lower() or "oom" in str(error).lower()
    say(f"a load that does not fit (ctx {ctx}): {status}; last_error {error!r}")
    say(f"  classified as out of memory: {oom}")
    return {"status": status, "last_error": error, "oom": oom}


def step_tokens(engine: Path, mdir: Path, logs: Path, runs: int) -> dict[str, Any]:
    def speeds(url: str, model: str | None) -> list[float]:
        out = []
        for _ in range(runs):
            body: dict[str, Any] = {"prompt": "hello", "n_predict": 256, "ignore_eos": True}
            if model:
                body["model"] = model
            status, doc = http_json(url + "/completion", body, timeout=300)
            if status != 200 or not isinstance(doc, dict):
                raise RuntimeError(f"{status} {doc}")
            out.append(float(doc["timings"]["predicted_per_second"]))
        return out

    port = free_port()
    direct = [str(engine), "-m", str(mdir / "g-a.gguf"), "-c", str(CTX), "--port", str(port)]
    with serving("engine-alone", direct, logs, wait=300) as url:
        alone = speeds(url, None)
    with serving("troupe", troupe(engine, "--models-dir", str(mdir), "-c", str(CTX)), logs) as url:
        complete(url, "g-a")
        through = speeds(url, "g-a")
    ratio = statistics.median(through) / statistics.median(alone)
    say(
        f"tokens/s (256 generated, median of {runs}): engine alone "
        f"{statistics.median(alone):.1f}, through troupe {statistics.median(through):.1f}: "
        f"{ratio:.3f}x (goal >= 0.95x)"
    )
    return {"alone": alone, "troupe": through, "ratio": ratio}


def step_swaps(engine: Path, mdir: Path, logs: Path, swaps: int) -> dict[str, Any]:
    def swap_times(url: str) -> list[float]:
        complete(url, "g-a", 4)
        out = []
        for i in range(swaps):
            started = time.monotonic()
            complete(url, ("g-b", "g-a")[i % 2], 4)
            out.append(time.monotonic() - started)
        return out

    common = ["--models-dir", str(mdir), "-c", str(CTX), "--models-max", "1"]
    port = free_port()
    cpp = [str(engine), *common, "--port", str(port)]
    with serving("llama-router", cpp, logs, wait=120) as url:
        theirs = swap_times(url)
    with serving("troupe", troupe(engine, *common), logs) as url:
        ours = swap_times(url)
    ratio = statistics.median(ours) / statistics.median(theirs)
    say(
        f"a swap (median of {swaps}): llama.cpp's router {statistics.median(theirs):.3f} s, "
        f"troupe {statistics.median(ours):.3f} s: {ratio:.3f}x"
    )
    return {"cpp": theirs, "troupe": ours, "ratio": ratio}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", type=Path, help="a llama-server build (default: build one)")
    parser.add_argument("--no-build", action="store_true", help="never run scripts/engine-cuda")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--embd", type=int, default=2048)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--swaps", type=int, default=6)
    args = parser.parse_args()

    gpu = bool(nvidia_smi("--query-gpu=name,memory.total,driver_version"))
    for row in nvidia_smi("--query-gpu=name,memory.total,driver_version"):
        say(f"GPU: {row[0]}, {row[1]} MiB, driver {row[2]}")
    if not gpu:
        say("no GPU (nvidia-smi answers nothing): the GPU steps say so")
    engine, built = (args.engine, None) if args.engine else build_engine(args.no_build)
    if built is not None:
        say(f"engine built in {built:.0f} s: {engine}")
    listing = subprocess.run(
        [str(engine), "--list-devices"], check=False, capture_output=True, text=True
    )
    say("engine devices: " + " | ".join(listing.stdout.strip().splitlines()[-4:]))

    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    logs = work / "logs"
    logs.mkdir()
    mdir = work / "models"
    started = time.monotonic()
    models(mdir, args.layers, args.embd)
    size = sum(p.stat().st_size for p in mdir.glob("*.gguf")) >> 20
    say(f"models written: {size} MiB in {time.monotonic() - started:.0f} s")
    summary: dict[str, Any] = {"gpu": gpu, "engine": str(engine), "built_seconds": built}
    try:
        summary["projection"] = step_projection(engine, mdir, logs, gpu)
        summary["eviction"] = step_eviction(engine, mdir, logs, gpu)
        summary["oom"] = step_oom(engine, mdir, logs, gpu)
        summary["tokens"] = step_tokens(engine, mdir, logs, args.runs)
        summary["swaps"] = step_swaps(engine, mdir, logs, args.swaps)
    finally:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "gpu_check.json").write_text(json.dumps(summary, indent=2, default=str))
        for log in sorted(logs.glob("*.log"))[:6]:
            shutil.copy(log, args.out / log.name)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
