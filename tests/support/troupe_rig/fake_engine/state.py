"""The fake engine's lifecycle: load (with faults), ready, sleep and wake, stop."""

from __future__ import annotations

import enum
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from troupe_rig.fake_engine.config import FakeConfig
from troupe_rig.fake_engine.protocol import CommandChannel, log, srv
from troupe_rig.fake_engine.responses import model_info

__all__ = ["EngineState", "Phase", "die"]

_PROGRESS_INTERVAL = 0.2  # llama.cpp throttles loading state lines to one per 200 ms
_GATE_POLL = 0.02


class Phase(enum.Enum):
    LOADING = "loading"
    READY = "ready"
    SLEEPING = "sleeping"


def die(code: int) -> None:
    """Exit at once, as a crashing C++ process would: no cleanup, no flushing."""
    os._exit(code)


def _oom_lines(model: str) -> list[tuple[str, str]]:
    # What llama.cpp's CUDA build logs when the weights do not fit (ggml-cuda.cu,
    # ggml-backend.cpp, llama-model.cpp, llama.cpp, common.cpp, server-context.cpp).
    return [
        ("E", "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 4096.00 MiB on device 0: "
              "cudaMalloc failed: out of memory"),
        ("E", "ggml_backend_buft_alloc_buffer_n_default: failed to allocate CUDA0 buffer of size "
              "4294967296"),
        ("E", "llama_model_load: error loading model: unable to allocate CUDA0 buffer"),
        ("E", "llama_model_load_from_file_impl: failed to load model"),
        ("E", f"cmn  common_init_: failed to load model '{model}'"),
        ("E", f"srv    load_model: failed to load model, '{model}'"),
        ("I", "srv    operator(): operator(): cleaning up before exit..."),
        ("E", "srv  llama_server: exiting due to model loading error"),
    ]  # fmt: skip


def _missing_lines(model: str, reason: str) -> list[tuple[str, str]]:
    return [
        ("E", f"gguf_init_from_file: failed to open GGUF file '{model}' ({reason})"),
        ("E", f"llama_model_load: error loading model: llama_model_loader: failed to load model "
              f"from {model}"),
        ("E", "llama_model_load_from_file_impl: failed to load model"),
        ("E", f"cmn  common_init_: failed to load model '{model}'"),
        ("E", f"srv    load_model: failed to load model, '{model}'"),
        ("I", "srv    operator(): operator(): cleaning up before exit..."),
        ("E", "srv  llama_server: exiting due to model loading error"),
    ]  # fmt: skip


def _log_all(lines: list[tuple[str, str]]) -> None:
    for level, text in lines:
        log(text, level)


class EngineState:
    """Everything the HTTP handlers and the lifecycle tasks share (one process, one model)."""

    def __init__(self, cfg: FakeConfig, channel: CommandChannel) -> None:
        self.cfg = cfg
        self.channel = channel
        self.phase = Phase.LOADING
        self.stopping = trio.Event()  # set by the exit command or a signal
        self.in_flight = 0
        self.slots_busy: set[int] = set()
        self.last_active = trio.current_time()
        self._activity = trio.Event()
        self._awake = trio.Event()
        self._wake_lock = trio.Lock()
        self.info: dict[str, object] = {}
        self.model_size = 0
        self.created = int(time.time())

    @property
    def ready(self) -> bool:
        """HTTP routes answer (llama-server's ``is_ready``): true after the first load."""
        return bool(self.info)

    async def load(self, *, resume: bool = False) -> None:
        """Load the model, reporting progress; faults exit the process from here."""
        cfg = self.cfg
        self.phase = Phase.LOADING
        self._awake = trio.Event()
        stages = ["text_model"] + (["mmproj_model"] if cfg.mmproj else [])
        progress = {"stages": stages, "current": "text_model"}
        self.channel.notify("loading", {**progress, "value": 0.0})
        if not resume:
            srv("load_model", f"loading model '{cfg.model}'")
            self._check_model_file()
        deadline = trio.current_time() + cfg.load_time
        faulty = (cfg.oom or cfg.load_crash >= 0) and not resume
        crash_at = trio.current_time() + cfg.load_time / 2 if faulty else float("inf")
        while True:
            now = trio.current_time()
            if now >= crash_at:
                self._load_fault()
            if now >= deadline:
                break
            await trio.sleep(min(_PROGRESS_INTERVAL, deadline - now, crash_at - now))
            now = trio.current_time()
            if now < deadline:
                value = 1.0 - (deadline - now) / cfg.load_time
                self.channel.notify("loading", {**progress, "value": round(value, 6)})
        # A file has no event to wait on: poll it.
        gate = trio.Path(cfg.load_gate) if cfg.load_gate and not resume else None
        while gate is not None and not await gate.exists():  # noqa: ASYNC110
            await trio.sleep(_GATE_POLL)
        self.channel.notify("loading", {**progress, "value": 1.0})
        if cfg.mmproj:
            self.channel.notify("loading", {"stage": "mmproj_model"})
        self.phase = Phase.READY
        self.last_active = trio.current_time()
        self._awake.set()
        if resume:
            srv("handle_sleeping_state", "server is exiting sleeping state")
            self.channel.notify("ready", {})
        else:
            n_ctx = cfg.n_ctx
            srv("load_model", f"initializing, n_slots = {cfg.n_slots}, n_ctx_slot = {n_ctx}, "
                "kv_unified = 'true'")  # fmt: skip
            self.info = model_info(cfg, self.model_size, self.created)
            srv("llama_server", "model loaded")

    def _check_model_file(self) -> None:
        model = self.cfg.model
        if model is None:
            return
        try:
            self.model_size = Path(model).stat().st_size
        except OSError as exc:
            _log_all(_missing_lines(model, exc.strerror or "unknown error"))
            die(1)

    def _load_fault(self) -> None:
        model = self.cfg.model or "fake-model"
        if self.cfg.oom:
            _log_all(_oom_lines(model))
            die(1)
        srv("load_model", f"fake: crashing during load with exit code {self.cfg.load_crash}", "E")
        die(self.cfg.load_crash)

    @asynccontextmanager
    async def busy(self) -> AsyncIterator[None]:
        """Hold the model awake for one request (waking it from sleep first)."""
        await self.ensure_awake()
        self.in_flight += 1
        self.last_active = trio.current_time()
        try:
            yield
        finally:
            self.in_flight -= 1
            self.last_active = trio.current_time()
            self._activity.set()

    async def ensure_awake(self) -> None:
        async with self._wake_lock:
            if self.phase is Phase.SLEEPING:
                await self.load(resume=True)
        await self._awake.wait()

    async def sleep_when_idle(self) -> None:
        """Go to sleep after ``sleep_idle`` seconds without requests (``--sleep-idle-seconds``)."""
        idle = self.cfg.sleep_idle
        while True:
            if self.phase is Phase.READY and self.in_flight == 0:
                due = self.last_active + idle
                if trio.current_time() >= due:
                    async with self._wake_lock:
                        if self.phase is Phase.READY and self.in_flight == 0:
                            self.phase = Phase.SLEEPING
                            self._awake = trio.Event()
                            self.channel.notify("sleeping", {})
                            srv("handle_sleeping_state", "server is entering sleeping state")
                    continue
                with trio.move_on_at(due):
                    await self._activity.wait()
            else:
                await self._activity.wait()
            self._activity = trio.Event()
