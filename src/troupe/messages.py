"""Every message sent to the scheduler actor, on one page (attrs, frozen).

Requests carry a one-shot reply channel opened by the asker; the scheduler answers
with ``send_nowait`` and drops a reply whose asker is gone. Instance actors report
what their child did, tagged with the generation they were started for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import trio

from troupe.catalog.prepared import PreparedCatalog
from troupe.download.plan import DownloadPlan
from troupe.sched.effects import Failure, Grant
from troupe.sched.memory import MemorySample
from troupe.sched.terms import DEFAULT_TERMS, TenantTerms

__all__ = [
    "Acquire",
    "BeginShutdown",
    "ChildState",
    "DownloadFailed",
    "DownloadFinished",
    "DownloadProgress",
    "Exited",
    "KeepAlive",
    "LoadModel",
    "MeasureFailed",
    "Measured",
    "MemorySampleFailed",
    "MemorySampled",
    "Message",
    "Release",
    "Reload",
    "RemoveModel",
    "ReplyChannel",
    "Rescanned",
    "Spawned",
    "StartDownload",
    "StopAll",
    "UnloadModel",
]

ReplyChannel = trio.MemorySendChannel[Grant | Failure | None]


@attrs.frozen
class Acquire:
    rid: int
    model: str
    autoload: bool
    update_last_used: bool
    reply: ReplyChannel
    ready_only: bool = False  # grant only a model that is loaded now; never wait
    terms: TenantTerms = DEFAULT_TERMS  # whose request (fair queuing, sched.fair)
    slot: bool = False  # it occupies one of the child's slots (waits while all are taken)


@attrs.frozen
class Release:
    """The lease ``rid`` ended, or its request stopped waiting."""

    rid: int
    tokens: int | None = None  # what its answer used, prompt + generated (None: unknown)


@attrs.frozen
class KeepAlive:
    """A request's ``keep_alive`` (the Ollama API) for child ``gen`` (None: the one running)."""

    rid: int
    model: str
    gen: int | None
    seconds: float  # idle seconds before it unloads; 0: once idle; inf: kept loaded
    reply: ReplyChannel
    until_gone: bool = False  # answered once the child it makes go is gone


@attrs.frozen
class LoadModel:
    rid: int
    model: str
    reply: ReplyChannel


@attrs.frozen
class UnloadModel:
    rid: int
    model: str
    reply: ReplyChannel


@attrs.frozen
class StopAll:
    rid: int
    reply: ReplyChannel


@attrs.frozen
class BeginShutdown:
    """Shutdown begins: answer every waiter, start no load, let leases finish."""

    rid: int
    reply: ReplyChannel


@attrs.frozen
class Reload:
    """``GET /models?reload=1``: re-scan the sources and reconcile (as upstream). Carried out by
    the scheduler whatever becomes of the asker."""

    rid: int
    reply: ReplyChannel


@attrs.frozen
class RemoveModel:
    """``DELETE /models?model=``: stop it, delete its cache files, reload (as upstream)."""

    rid: int
    model: str
    reply: ReplyChannel


@attrs.frozen
class Rescanned:
    """A scan the scheduler started is done: the catalog, or why it could not be read.
    ``removed``: the model whose files were deleted first (a removal's reload)."""

    rid: int
    result: PreparedCatalog | str
    removed: str | None = None


@attrs.frozen
class MemorySampled:
    sample: MemorySample
    version: int


@attrs.frozen
class Measured:
    """The engine's projection for ``model`` under the configuration ``fingerprint``:
    bytes per device at the context the child will use (``need``) and, when fit had to
    shrink its context, at the initial parameters (``high``)."""

    model: str
    fingerprint: str
    need: Mapping[str, int]
    high: Mapping[str, int] | None = None


@attrs.frozen
class MeasureFailed:
    model: str
    fingerprint: str
    reason: str


@attrs.frozen
class MemorySampleFailed:
    version: int


@attrs.frozen
class Spawned:
    model: str
    gen: int
    port: int
    pid: int
    connections: int = 7  # how many the child serves at once (child/http_threads.py)
    slots: int | None = None  # its --parallel (child/http_threads.py parallel_slots)


@attrs.frozen
class ChildState:
    model: str
    gen: int
    state: str
    payload: Any


@attrs.frozen
class Exited:
    model: str
    gen: int
    code: int  # upstream's view: a signal death is 1
    expected: bool  # troupe asked it to stop
    detail: str | None  # why, with the last stderr lines, for an unexpected or failed exit
    oom: bool = False  # its log said it ran out of memory
    oom_device: str | None = None  # on this device ("cuda:1"), when its log named one


@attrs.frozen
class StartDownload:
    """``POST /models``: ``plan`` as the hub answered, or None with why not (``error``)."""

    rid: int
    name: str
    plan: DownloadPlan | None
    error: str
    error_status: int
    reply: ReplyChannel


@attrs.frozen
class DownloadProgress:
    """Bytes received so far, per file URL, for every file of download ``job``."""

    name: str
    job: int
    progress: Mapping[str, tuple[int, int]]  # url -> (done, total)


@attrs.frozen
class DownloadFinished:
    name: str
    job: int
    listed: str  # the name the catalog lists it under: org/repo:TAG


@attrs.frozen
class DownloadFailed:
    name: str
    job: int
    reason: str
    status: int = 0  # the hub's HTTP status when it refused (404, 401...), else 0
    cancelled: bool = False  # troupe stopped it (an unload, a DELETE, a shutdown)


Message = (
    Acquire
    | Release
    | KeepAlive
    | LoadModel
    | UnloadModel
    | StopAll
    | BeginShutdown
    | Reload
    | RemoveModel
    | Rescanned
    | MemorySampled
    | MemorySampleFailed
    | Measured
    | MeasureFailed
    | Spawned
    | ChildState
    | Exited
    | StartDownload
    | DownloadProgress
    | DownloadFinished
    | DownloadFailed
)
