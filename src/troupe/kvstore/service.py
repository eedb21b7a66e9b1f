"""`KvService`: what the rest of troupe asks of the KV store.

- the launcher: `launch_args` (``--slot-save-path``, ``--swa-full`` for SWA models)
  and `measure_args` (the same KV layout, so the engine's projection counts it);
- the instance actor's stop: `save_slots`, run before the exit command and bounded
  by the instance (a save that overruns is abandoned, the stop goes on);
- the request path: `steer`, before a completion or chat request is proxied to a child
  that has not had its entries offered yet: the stored entry sharing the longest token
  prefix with the request's prompt is checked, restored into a slot never used, and the
  request is sent to that slot (``id_slot``). Any trouble leaves the request as it was.

Entries are keyed by `kv_identity` of the child's exact argv, so they never cross into
a child whose KV layout differs.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterable
from typing import Any

import attrs
import trio

from troupe.kvstore.engine_api import EngineCallFailed, call
from troupe.kvstore.identity import kv_identity
from troupe.kvstore.metrics import KvMetrics
from troupe.kvstore.store import KvEntry, KvStore, checksum, describe, write_sidecar
from troupe.modellog import about

__all__ = ["COMPLETION_PATHS", "KvService"]

log = logging.getLogger("troupe.kvstore")

MIN_TOKENS = 256  # a slot holding fewer cached tokens is cheap to compute again: not saved
MIN_MATCH = 64  # a shorter shared prefix is not worth a slot
SAVE_SECONDS = 10.0  # all of one stop's saves
SLOTS_SECONDS = 2.0  # GET /slots before a stop
RESTORE_SECONDS = 10.0  # one request's lookup and restore

CHAT_PATHS = ("/v1/chat/completions", "/chat/completions")
COMPLETION_PATHS = ("/completion", "/completions", "/v1/completions")


@attrs.define
class _Offer:
    """One child (model, generation): which entries it was given and which slots."""

    gen: int
    restored: set[str] = attrs.field(factory=set)
    slots: set[int] = attrs.field(factory=set)
    lock: trio.Lock = attrs.field(factory=trio.Lock)


def _route(path: str) -> str | None:
    path = path.split("?", 1)[0]
    for p in CHAT_PATHS:
        if path.endswith(p):
            return "chat"
    for p in COMPLETION_PATHS:
        if path.endswith(p):
            return "completion"
    return None


class KvService:
    def __init__(
        self,
        store: KvStore,
        metrics: KvMetrics | None = None,
        *,
        min_tokens: int = MIN_TOKENS,
        save_seconds: float = SAVE_SECONDS,
    ) -> None:
        self.store = store
        self.metrics = metrics or KvMetrics()
        self.min_tokens = min_tokens
        self.save_seconds = save_seconds
        self._idents: dict[str, str] = {}  # model -> its running child's KV identity
        self._offers: dict[str, _Offer] = {}

    # ----- the launcher ----------------------------------------------------------------------

    @staticmethod
    def measure_args(args: list[str], swa: bool) -> list[str]:
        """``args`` with the KV layout the store needs (a SWA model keeps its full cache:
        the engine reuses nothing of a restored slot otherwise)."""
        if swa and "--swa-full" not in args:
            return [*args, "--swa-full"]
        return args

    def launch_args(self, model: str, args: list[str], swa: bool) -> list[str]:
        if any(a.split("=", 1)[0] == "--slot-save-path" for a in args):
            # The user's own slot files: theirs to manage, the store keeps out of them.
            self._idents.pop(model, None)
            return args
        full = self.measure_args(args, swa)
        ident = kv_identity(full)
        if self._idents.get(model) != ident:
            dropped = self.store.drop_model(model, keep_ident=ident)
            if dropped:
                about(log, model).info("dropped %d KV entries of its old arguments", dropped)
            self._update_gauges(model)
        self._idents[model] = ident
        return [*full, "--slot-save-path", str(self.store.slot_dir(ident))]

    def forget_models(self, known: Iterable[str]) -> None:
        """Models no longer in the catalogue lose their entries."""
        known = set(known)
        models = {e.model for e in self.store.entries()}
        self.store.drop_unknown(known)
        for model in models:
            self._update_gauges(model)

    def refuses(self, model: str, path: str, action: str) -> bool:
        """A client's slot save or restore on a child whose slot path is the store's: the
        engine would let it write (and read) files the store owns, outside its budget.
        Without the store such a child has no slot path, and the engine refuses too."""
        return model in self._idents and "/slots/" in path and action in ("save", "restore")

    def usage(self, model: str) -> tuple[int, int]:
        return self.store.usage(model)

    # ----- before a stop -----------------------------------------------------------------------

    async def save_slots(self, model: str, port: int) -> None:
        """Save every idle slot of the child at ``port`` that holds enough tokens."""
        ident = self._idents.get(model)
        if ident is None:
            return
        mlog = about(log, model)
        slots: Any = None
        # A child that cannot say what its slots hold at once (stopped, hung) is not
        # worth the stop's time.
        with trio.move_on_after(SLOTS_SECONDS):
            try:
                slots = await call(port, "GET", "/slots")
            except (OSError, EngineCallFailed) as exc:
                mlog.info("KV save skipped: cannot read its slots: %s", exc)
                return
        if slots is None:
            mlog.info("KV save skipped: its slots did not answer within %gs", SLOTS_SECONDS)
            return
        for slot in slots if isinstance(slots, list) else []:
            if not isinstance(slot, dict) or slot.get("is_processing"):
                continue
            # A slot that served a task holds tokens; how many, /slots does not say
            # reliably (a restored slot's next task reads 0): the saved file tells.
            if "id_task" not in slot or not isinstance(slot.get("id"), int):
                continue
            await self._save_one(model, ident, port, int(slot["id"]))

    async def _save_one(self, model: str, ident: str, port: int, slot: int) -> None:
        mlog = about(log, model)
        name = self.store.new_name()
        path = self.store.slot_dir(ident) / f"{name}.bin"
        started = trio.current_time()
        entry: KvEntry | None = None
        try:
            await call(port, "POST", f"/slots/{slot}?action=save", {"filename": path.name})
            described = await trio.to_thread.run_sync(describe, path)
            if described is None:
                raise EngineCallFailed("the saved file is not a slot file")
            tokens, digest, size = described
            if len(tokens) < self.min_tokens:  # cheap to compute again: not kept
                path.unlink(missing_ok=True)
                return
            entry = KvEntry(ident, name, model, tokens, digest, size, 0.0)
            self.store.touch(entry)
            await trio.to_thread.run_sync(write_sidecar, entry, self.store.root)
        except BaseException as exc:
            # Nothing half-saved stays: no sidecar, no entry (a full disk lands here too).
            path.unlink(missing_ok=True)
            if isinstance(exc, (OSError, EngineCallFailed)):
                mlog.warning("KV save of slot %d failed: %s", slot, exc)
                self.metrics.saves.labels(model, "failed").inc()
                return
            if isinstance(exc, trio.Cancelled):
                mlog.warning("KV save of slot %d abandoned (over %gs)", slot, self.save_seconds)
                self.metrics.saves.labels(model, "abandoned").inc()
            raise
        seconds = trio.current_time() - started
        gone = self.store.add(entry)
        self.metrics.saves.labels(model, "saved").inc()
        self.metrics.bytes.labels(model, "saved").inc(entry.size)
        self.metrics.save_seconds.labels(model).observe(seconds)
        mlog.info(
            "KV: saved slot %d (%d tokens, %.1f MiB) in %.0f ms%s",
            slot,
            len(entry.tokens),
            entry.size / (1 << 20),
            seconds * 1000,
            f"; {len(gone)} older entries dropped" if gone else "",
        )
        for model_gone in {e.model for e in gone} | {model}:
            self._update_gauges(model_gone)

    # ----- before a request ------------------------------------------------------------------

    def _pending(self, model: str, gen: int) -> tuple[str, _Offer] | None:
        ident = self._idents.get(model)
        if ident is None:
            return None
        offer = self._offers.get(model)
        if offer is None or offer.gen != gen:
            offer = self._offers[model] = _Offer(gen)
        if not any(e.name not in offer.restored for e in self.store.entries(ident)):
            return None
        return ident, offer

    async def steer(self, model: str, gen: int, port: int, path: str, body: bytes) -> bytes:
        """``body``, sent to a slot restored for it when a stored entry matches."""
        route = _route(path)
        if route is None:
            return body
        pending = self._pending(model, gen)
        if pending is None:
            return body
        try:
            request = json.loads(body)
        except ValueError:
            return body
        if not isinstance(request, dict) or request.get("id_slot", -1) != -1:
            return body
        ident, offer = pending
        with trio.move_on_after(RESTORE_SECONDS):
            async with offer.lock:
                try:
                    slot = await self._restore_for(model, ident, offer, port, route, request)
                except Exception:  # a restore is an optimisation: never the request's failure
                    about(log, model).exception("KV restore failed")
                    self.metrics.restores.labels(model, "failed").inc()
                    return body
                if slot is not None:
                    request["id_slot"] = slot
                    return json.dumps(request).encode()
        return body

    async def _restore_for(
        self,
        model: str,
        ident: str,
        offer: _Offer,
        port: int,
        route: str,
        request: dict[str, Any],
    ) -> int | None:
        mlog = about(log, model)
        started = trio.current_time()
        try:
            tokens = await self._prompt_tokens(port, route, request)
            if tokens is None:
                return None
            while True:
                match = self.store.best_match(ident, tokens, exclude=offer.restored)
                if match is None or match[1] < MIN_MATCH:
                    self.metrics.lookups.labels(model, "miss").inc()
                    return None
                entry, shared = match
                path = self.store.file(entry)
                digest = await trio.to_thread.run_sync(_checksum_or_none, path)
                if digest == entry.sha256:
                    break
                mlog.warning("KV entry %s is corrupt (checksum): dropped", entry.name)
                self.metrics.restores.labels(model, "corrupt").inc()
                self.store.drop(entry)
                self._update_gauges(model)
            slot = await self._free_slot(port, offer)
            if slot is None:
                self.metrics.lookups.labels(model, "miss").inc()
                return None
            answer = await call(
                port, "POST", f"/slots/{slot}?action=restore", {"filename": path.name}
            )
        except (OSError, EngineCallFailed) as exc:
            mlog.warning("KV restore failed: %s", exc)
            self.metrics.restores.labels(model, "failed").inc()
            return None
        seconds = trio.current_time() - started
        offer.restored.add(entry.name)
        offer.slots.add(slot)
        self.store.touch(entry)
        with contextlib.suppress(OSError):  # its last use survives a restart (LRU order)
            await trio.to_thread.run_sync(write_sidecar, entry, self.store.root)
        n_read = answer.get("n_read", entry.size) if isinstance(answer, dict) else entry.size
        self.metrics.lookups.labels(model, "hit").inc()
        self.metrics.restores.labels(model, "restored").inc()
        self.metrics.bytes.labels(model, "restored").inc(n_read)
        self.metrics.restore_seconds.labels(model).observe(seconds)
        mlog.info(
            "KV: restored %d tokens (%d shared with the request, %.1f MiB) into slot %d in %.0f ms",
            len(entry.tokens),
            shared,
            entry.size / (1 << 20),
            slot,
            seconds * 1000,
        )
        return slot

    @staticmethod
    async def _prompt_tokens(port: int, route: str, request: dict[str, Any]) -> list[int] | None:
        """The request's prompt as the engine tokenizes it (chat: through its template)."""
        if route == "chat":
            if not isinstance(request.get("messages"), list):
                return None
            rendered = await call(port, "POST", "/apply-template", request)
            prompt = rendered.get("prompt") if isinstance(rendered, dict) else None
        else:
            prompt = request.get("prompt")
        if not isinstance(prompt, str) or not prompt:
            return None
        answer = await call(port, "POST", "/tokenize", {"content": prompt, "add_special": True})
        tokens = answer.get("tokens") if isinstance(answer, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            return None
        return tokens

    @staticmethod
    async def _free_slot(port: int, offer: _Offer) -> int | None:
        """A slot that never served a request (nothing of another conversation is lost)."""
        slots = await call(port, "GET", "/slots")
        for slot in slots if isinstance(slots, list) else []:
            if not isinstance(slot, dict) or not isinstance(slot.get("id"), int):
                continue
            if slot.get("is_processing") or "id_task" in slot or slot["id"] in offer.slots:
                continue
            return int(slot["id"])
        return None

    def _update_gauges(self, model: str) -> None:
        entries, size = self.store.usage(model)
        self.metrics.stored_entries.labels(model).set(entries)
        self.metrics.stored_bytes.labels(model).set(size)


def _checksum_or_none(path: Any) -> str | None:
    try:
        return checksum(path)
    except OSError:
        return None
