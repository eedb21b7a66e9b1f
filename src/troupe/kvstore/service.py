"""`KvService`: what the rest of troupe asks of the KV store.

- the launcher: `launch_args` (``--slot-save-path``, ``--swa-full`` for SWA models,
  ``--no-cache-idle-slots`` so an idle slot keeps its cells) and `measure_args` (the
  same KV layout, so the engine's projection counts it);
- the instance actor's stop: `save_slots`, run before the exit command and bounded
  by the instance (a save that overruns is abandoned, the stop goes on);
- the request path: `held` (a parsed request: Ollama's, a realtime response's) or
  `steered` (the client's bytes), around a completion or chat request sent to a child:
  the request is held on a slot of the child's `SlotMap` (its conversation's own, or one
  it takes: the conversation there saved first, the stored entry sharing the longest
  prefix with the prompt restored), and sent to it (``id_slot``); the caller tells the
  `Hold` what the slot holds after the answer (`tokens_held`), so a slot too small to
  keep is later taken without a save.

Entries are keyed by `kv_identity` of the child's exact argv, so they never cross into
a child whose KV layout differs.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio

from troupe.api import last_object
from troupe.kvstore.engine_api import EngineCallFailed, call
from troupe.kvstore.identity import kv_identity
from troupe.kvstore.metrics import KvMetrics
from troupe.kvstore.restore import prompt_tokens, restore_best, route
from troupe.kvstore.slots import Claim, SlotMap, request_text
from troupe.kvstore.store import KvEntry, KvStore, describe, write_sidecar
from troupe.modellog import about

__all__ = ["Hold", "KvService", "tokens_held", "tokens_in"]

log = logging.getLogger("troupe.kvstore")

MIN_TOKENS = 256  # a slot holding fewer cached tokens is cheap to compute again: not saved
SAVE_SECONDS = 10.0  # all of one stop's saves
SLOTS_SECONDS = 2.0  # GET /slots (before a stop, or for a child's first request)
RESTORE_SECONDS = 10.0  # one request's save, lookup and restore


@attrs.define
class Hold:
    """One request's place on a slot of its child while it runs (`KvService.held`)."""

    slot: int | None  # sent as ``id_slot``; None: sent as it came (not steered)
    body: bytes = b""  # (`KvService.steered`) the bytes to send
    # The caller's count, from the answer, of the tokens the slot holds after it
    # (`tokens_held`): a slot under the store's threshold is then taken without a save.
    tokens: int | None = None


@attrs.define
class _MapOnce:
    """A child's `SlotMap`, made once by its first request while the others wait."""

    done: trio.Event = attrs.field(factory=trio.Event)
    map: SlotMap | None = None


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
        self._maps: dict[str, tuple[int, _MapOnce]] = {}  # model -> its child's (gen, map)
        self._keeps: dict[str, bool] = {}  # model -> its child keeps idle slots' cells

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
            self.leave_out(model)
            return args
        full = self.measure_args(args, swa)
        ident = kv_identity(full)
        if self._idents.get(model) != ident:
            dropped = self.store.drop_model(model, keep_ident=ident)
            if dropped:
                about(log, model).info("dropped %d KV entries of its old arguments", dropped)
            self._update_gauges(model)
        self._idents[model] = ident
        # The engine's default moves every idle slot into its RAM cache (and clears it,
        # with a unified KV cache) whenever a task starts: no slot would keep its
        # conversation for the store to save or steer to. A preset that asks for it
        # keeps it, and the store then only restores into slots that never served.
        names = {a.split("=", 1)[0] for a in args}
        self._keeps[model] = "--cache-idle-slots" not in names
        keep = (
            []
            if names & {"--cache-idle-slots", "--no-cache-idle-slots"}
            else ["--no-cache-idle-slots"]
        )
        return [*full, *keep, "--slot-save-path", str(self.store.slot_dir(ident))]

    def leave_out(self, model: str) -> None:
        """``model``'s child runs without the store (its preset has ``kv-store = off``);
        its entries stay for when it is back on."""
        self._idents.pop(model, None)
        self._maps.pop(model, None)

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
        self._maps.pop(model, None)  # its child is stopping
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

    # ----- around a request ------------------------------------------------------------------

    @asynccontextmanager
    async def steered(
        self, model: str, gen: int, port: int, path: str, body: bytes, conv: str = ""
    ) -> AsyncIterator[Hold]:
        """`held` for bytes: the hold's ``body`` is what to send to the child; any
        trouble, or a body that is not a JSON object, leaves it as it came."""
        kind = route(path)
        request: Any = None
        if kind is not None and model in self._idents:
            with contextlib.suppress(ValueError):
                request = json.loads(body)
        if not isinstance(request, dict):
            yield Hold(None, body)
            return
        async with self.held(model, gen, port, path, request, conv) as hold:
            hold.body = body if hold.slot is None else with_slot(body, request, hold.slot)
            yield hold

    @asynccontextmanager
    async def held(
        self, model: str, gen: int, port: int, path: str, request: dict[str, Any], conv: str = ""
    ) -> AsyncIterator[Hold]:
        """The slot ``request`` is to run on (sent as ``id_slot``), held until the block
        exits: the slot of its conversation when that is still on one; else an empty
        slot, or the least recently used idle one (its conversation saved to the store
        first), with the stored entry sharing the longest prefix with the prompt
        restored into it. No slot: sent as it is (not steered, or the client chose)."""
        kind = route(path)
        ident = self._idents.get(model)
        if ident is None or kind is None or _several_tasks(request):
            yield Hold(None)  # (several tasks: the engine spreads them over slots itself)
            return
        slots = await self._slot_map(model, gen, port)
        chosen = request.get("id_slot", -1)
        if slots is None or chosen != -1:
            if slots is not None and isinstance(chosen, int):
                slots.overwritten(chosen)  # the client's own choice: its content unknown
            yield Hold(None)
            return
        claim = await slots.claim(conv, request_text(request))
        if claim is None:
            yield Hold(None)
            return
        hold = Hold(claim.slot)
        answered = False
        try:
            # Shielded and bounded: a client that leaves meanwhile cannot cut a save or
            # a restore in two (one that overruns is abandoned: the engine's own reuse
            # decides what the request gets from the slot, correct either way).
            with trio.CancelScope(shield=True, deadline=trio.current_time() + RESTORE_SECONDS):
                try:
                    await self._prepare(model, ident, port, kind, request, slots, claim)
                except Exception:  # the store is an optimisation: never the request's failure
                    about(log, model).exception("KV: moving slot %d failed", claim.slot)
            yield hold
            answered = True
        finally:
            # Not answered (the client left, the child failed): what the slot holds is
            # unknown, and it is saved before another conversation takes it.
            slots.release(claim, answered, hold.tokens)

    async def _prepare(
        self,
        model: str,
        ident: str,
        port: int,
        kind: str,
        request: dict[str, Any],
        slots: SlotMap,
        claim: Claim,
    ) -> None:
        if claim.evict:
            await self._save_one(model, ident, port, claim.slot)
        if claim.own or not self.store.entries(ident):
            return
        try:
            tokens = await prompt_tokens(port, kind, request)
        except (OSError, EngineCallFailed) as exc:
            about(log, model).info("KV restore skipped: cannot tokenize the prompt: %s", exc)
            return
        if tokens is not None:
            await restore_best(self.store, self.metrics, model, ident, port, claim.slot, tokens)

    async def _slot_map(self, model: str, gen: int, port: int) -> SlotMap | None:
        """The map of ``model``'s child ``gen``, read from its ``GET /slots`` once (the
        first request waits for it; None when the child cannot tell)."""
        pending = self._maps.get(model)
        if pending is None or pending[0] != gen:
            pending = (gen, _MapOnce())
            self._maps[model] = pending
            once = pending[1]
            try:
                with trio.CancelScope(shield=True), trio.move_on_after(SLOTS_SECONDS):
                    slots = await call(port, "GET", "/slots")
                    ids = [s["id"] for s in slots if isinstance(s.get("id"), int)]
                    served = {s["id"] for s in slots if "id_task" in s}
                    keeps = self._keeps.get(model, True)
                    once.map = SlotMap(ids, served, keeps, min_tokens=self.min_tokens)
                if once.map is None and self._maps.get(model) is pending:
                    del self._maps[model]  # too slow to answer now: the next request asks again
            except OSError as exc:
                about(log, model).info("KV: cannot read its slots (asked again later): %s", exc)
                if self._maps.get(model) is pending:
                    del self._maps[model]
            except (EngineCallFailed, TypeError, AttributeError) as exc:
                # It refuses (--no-slots) or answers nonsense: this child is not steered.
                about(log, model).info("KV: no slot steering, cannot read its slots: %s", exc)
            finally:
                once.done.set()
        once = pending[1]
        await once.done.wait()
        return once.map

    def _update_gauges(self, model: str) -> None:
        entries, size = self.store.usage(model)
        self.metrics.stored_entries.labels(model).set(entries)
        self.metrics.stored_bytes.labels(model).set(size)


def _several_tasks(request: dict[str, Any]) -> bool:
    """A request the engine runs as several tasks (prompts in a list, ``n`` > 1): held
    on one slot they would run one after another."""
    prompt = request.get("prompt")
    batch = isinstance(prompt, list) and any(not isinstance(p, int) for p in prompt)
    return batch or request.get("n", 1) not in (1, None)


def with_slot(body: bytes, request: dict[str, Any], slot: int) -> bytes:
    """``body`` with ``"id_slot": slot``: spliced in after its opening brace when it is
    UTF-8 without the key (the rest of the bytes go as the client sent them, unparsed
    again), else ``request`` written out whole."""
    start = len(body) - len(body.lstrip())
    plain = json.detect_encoding(body) == "utf-8" and body[start : start + 1] == b"{"
    if "id_slot" in request or not plain:
        return json.dumps({**request, "id_slot": slot}).encode()
    sep = b"" if not request else b","
    return b'%s{"id_slot":%d%s%s' % (body[:start], slot, sep, body[start + 1 :])


def tokens_held(answer: bytes) -> int | None:
    """The tokens a slot holds after ``answer`` (a whole JSON answer, or the last bytes
    of a stream), from its ``timings`` (`tokens_in`)."""
    return tokens_in(last_object(answer, b"timings"))


def tokens_in(timings: object) -> int | None:
    """An answer's ``timings``: cached + evaluated + predicted tokens (what its slot
    holds after it). None when it does not say."""
    if not isinstance(timings, dict):
        return None
    counts = [timings.get(k) for k in ("cache_n", "prompt_n", "predicted_n")]
    ints = [c for c in counts if isinstance(c, int) and not isinstance(c, bool)]
    return sum(ints) if len(ints) == len(counts) else None
