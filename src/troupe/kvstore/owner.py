"""`SlotOwner`: the KV store's side of one child generation, the only writer of its slots.

One is made when a child starts (the transport's `child_started`, with the child's
port) and dropped when it exits (`child_gone`): nothing of a child's slots outlives it,
and nothing of an older child's reaches a newer one. It holds the child's `SlotMap`
(read from the child's ``GET /slots`` by its first request) and does every save and
restore for that child; the request tasks (`KvService.held`) and the instance's stop
(`KvService.save_slots`) ask it. Every call it makes goes through the one transport,
keyed by (model, generation): once its child stops, only the stop's own save is sent
(``final``); once it is gone, nothing.

Every state change that spans an await survives the cancellation of the task that
started it: the slot map is read in a shielded, bounded scope (the requests waiting for
it are not left with half a map), a save or restore under a request's claim is shielded
and bounded, a save cut short leaves no file and no entry, and a claim is given back in
a ``finally``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import trio

from troupe.kvstore.engine_api import ChildGone, EngineCallFailed
from troupe.kvstore.restore import MIN_MATCH, prompt_tokens, restore_best
from troupe.kvstore.slots import Claim, SlotMap, request_text
from troupe.kvstore.store import KvEntry, describe, write_sidecar
from troupe.modellog import about
from troupe.proxy.upstream import ChildRef

if TYPE_CHECKING:
    from troupe.kvstore.service import KvService

__all__ = ["RESTORE_SECONDS", "SLOTS_SECONDS", "Hold", "SlotOwner"]

log = logging.getLogger("troupe.kvstore")

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
    # Sent with ``"cache_prompt": false``: its slot may hold another tenant's tokens.
    fresh: bool = False
    # The caller's ``timings.cache_n`` from the answer (`cached_held`): after a restore,
    # whether the engine reused what was restored.
    cached: int | None = None

    def fields(self) -> dict[str, Any]:
        """What a parsed request gets added before it is sent (`KvService.held`)."""
        out: dict[str, Any] = {} if self.slot is None else {"id_slot": self.slot}
        if self.fresh:
            out["cache_prompt"] = False
        return out


class SlotOwner:
    """One child generation's slots: its map, its saves and its restores.

    ``ident``: the KV identity of the child's argv (None: no files, the slots only
    steered); ``keeps``: the child keeps an idle slot's cells."""

    def __init__(self, kv: KvService, child: ChildRef, ident: str | None, keeps: bool) -> None:
        self.kv = kv
        self.child = child
        self.ident = ident
        self.keeps = keeps
        self.map: SlotMap | None = None
        self._read: trio.Event | None = None  # set once a read of the map ended
        self.stopping = False  # its stop began: no slot is claimed any more
        self.gone = False  # its child exited

    @property
    def model(self) -> str:
        return self.child.model

    # ----- the slot map ------------------------------------------------------------------------

    async def slot_map(self) -> SlotMap | None:
        """The child's map, read from its ``GET /slots`` once (the first request reads it,
        the others wait for it; None when the child cannot tell, or is going)."""
        going = self.stopping or self.gone
        if going or not self.kv.api.pool.accepts(self.child.model, self.child.gen):
            return None  # its child stops: nothing is sent to it but the stop's own save
        if self.map is not None:
            return self.map
        read = self._read
        if read is not None:
            await read.wait()  # another request is reading it
            return self.map
        read = self._read = trio.Event()
        try:
            # Shielded: a first request that leaves cannot leave the others a half-read
            # map; bounded, so none of them waits on a hung child for long.
            with trio.CancelScope(shield=True), trio.move_on_after(SLOTS_SECONDS):
                self.map = self._map_of(await self.kv.api.call(self.child, "GET", "/slots"))
            if self.map is None:
                self._read = None  # too slow to answer now: the next request asks again
        except ChildGone:
            pass  # stopping or gone: no map, ever
        except (EngineCallFailed, TypeError, AttributeError) as exc:
            # It refuses (--no-slots) or answers nonsense: this child is not steered.
            about(log, self.model).info("KV: no slot steering, cannot read its slots: %s", exc)
        finally:
            read.set()
        return self.map

    def _map_of(self, slots: Any) -> SlotMap:
        ids = [s["id"] for s in slots if isinstance(s.get("id"), int)]
        served = {s["id"] for s in slots if "id_task" in s}
        kv = self.kv
        return SlotMap(ids, served, self.keeps, min_tokens=kv.min_tokens, private=kv.private)

    def loose(self) -> contextlib.AbstractContextManager[None]:
        """A request the engine places itself on the child (`SlotMap.loose`)."""
        return contextlib.nullcontext() if self.map is None else self.map.loose()

    def shows(self, slot: int, tenant: str) -> bool:
        return self.map is not None and self.map.shows(slot, tenant)

    # ----- around a request ------------------------------------------------------------------

    @asynccontextmanager
    async def held(
        self, kind: str, request: dict[str, Any], conv: str, tenant: str
    ) -> AsyncIterator[Hold]:
        """`KvService.held` for a request this child's map may steer."""
        fresh = self.kv.private
        slots = await self.slot_map()
        chosen = request.get("id_slot", -1)
        if slots is None or chosen != -1:
            with contextlib.ExitStack() as stack:
                if slots is not None and isinstance(chosen, int):
                    # The client's own choice: that slot is busy meanwhile (no request
                    # is sent to wait for it in the engine), its content unknown after.
                    stack.enter_context(slots.outside(chosen))
                yield Hold(None, fresh=fresh)
            return
        claim = await slots.claim(conv, request_text(request), tenant)
        if claim is None:
            with slots.loose():
                yield Hold(None, fresh=fresh)
            return
        held = Hold(claim.slot)
        answered = False
        restored = 0
        try:
            # Shielded and bounded: a client that leaves meanwhile cannot cut a save or
            # a restore in two (one that overruns is abandoned: the engine's own reuse
            # decides what the request gets from the slot, correct either way).
            with trio.CancelScope(shield=True, deadline=trio.current_time() + RESTORE_SECONDS):
                try:
                    restored = await self._prepare(kind, request, claim, tenant)
                except Exception:  # the store is an optimisation: never the request's failure
                    about(log, self.model).exception("KV: moving slot %d failed", claim.slot)
            # A restore replaced the slot's cells with this tenant's own; else what
            # another tenant left there must not be reused.
            held.fresh = claim.foreign and not restored
            yield held
            answered = True
            kv = self.kv
            replicate = kv.replicas is not None and kv.restore_off(self.model) is None
            if replicate and (held.tokens or 0) >= kv.min_tokens:
                # In a cluster the conversation may be served on another node next (its
                # node dies, or is full): its slot is saved after the turn, in the
                # background (this slot is not held meanwhile: the conversation's next
                # turn takes it at once), and the file pushed there.
                assert kv.replicas is not None
                kv.replicas.after_turn(self, claim.slot, tenant, slots.stamp(claim.slot))
            if restored and self.ident and request.get("cache_prompt", True) is not False:
                self.kv.check_restore(self.model, self.ident, restored, held.cached)
        finally:
            # Not answered (the client left, the child failed): what the slot holds is
            # unknown, and it is saved before another conversation takes it.
            slots.release(claim, answered, held.tokens)

    async def _prepare(self, kind: str, request: dict[str, Any], claim: Claim, tenant: str) -> int:
        """The claimed slot's old conversation saved, the best entry restored; returns
        how many of the prompt's tokens the restored entry shares (0: none restored)."""
        kv, ident, store = self.kv, self.ident, self.kv.store
        if ident is None or store is None:
            return 0  # no files: the slot keeps what it holds, the engine reuses it or not
        if kv.restore_off(self.model) is not None:
            return 0  # the engine ignores what is restored: nothing worth saving either
        if claim.evict and (claim.owner or not kv.private):
            await self.save_one(claim.slot, claim.owner or "")
        replicas = kv.replicas  # in a cluster: the peers may hold what this node does not
        if claim.own or (replicas is None and not store.entries(ident)):
            return 0
        try:
            tokens = await prompt_tokens(kv.api, self.child, kind, request)
        except EngineCallFailed as exc:
            about(log, self.model).info("KV restore skipped: cannot tokenize the prompt: %s", exc)
            return 0
        if tokens is None:
            return 0
        if replicas is not None:
            # A conversation served elsewhere before (failover, spill): its slot file is
            # asked of the peers when this node's best entry leaves a prefill to make.
            here = store.best_match(ident, tokens, tenant=tenant)
            have = here[1] if here is not None and here[1] >= MIN_MATCH else 0
            if len(tokens) - have >= MIN_MATCH:
                await replicas.fetch(self.model, ident, tenant, tokens, have)
        return await restore_best(
            kv.api, store, kv.metrics, self.child, ident, claim.slot, tokens, tenant
        )

    # ----- before a stop -----------------------------------------------------------------------

    async def save_all(self) -> None:
        """Before the child's stop: from now on no slot is claimed, and every idle slot
        that served is saved (one that holds too few tokens is not kept)."""
        self.stopping = True
        kv, mlog = self.kv, about(log, self.model)
        if self.ident is None or kv.restore_off(self.model) is not None:
            return
        slots: Any = None
        # A child that cannot say what its slots hold at once (stopped, hung) is not
        # worth the stop's time.
        with trio.move_on_after(SLOTS_SECONDS):
            try:
                slots = await kv.api.call(self.child, "GET", "/slots", final=True)
            except EngineCallFailed as exc:
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
            owner = self.map.owner(slot["id"]) if self.map is not None else ""
            if kv.private and not owner:
                continue  # whose tokens it holds is unknown: no tenant may have them back
            await self.save_one(int(slot["id"]), owner or "", final=True)

    async def save_after_turn(
        self, slot: int, tenant: str, stamp: tuple[int, str | None] | None
    ) -> None:
        """A turn's slot saved once the turn is over (`Replicas.after_turn`), the slot not
        held: the engine saves it at once, or after a request that started on it
        meanwhile (the conversation's next turn: its cells then, read from the file).
        With several tenants it is kept only if no request was placed on the slot since
        (``stamp``): the engine's save may have come after another tenant's request."""
        if self.stopping or self.gone or self.map is None or stamp is None:
            return
        slots = self.map

        def unchanged() -> bool:
            return not self.kv.private or slots.stamp(slot) == stamp

        if unchanged():
            with trio.move_on_after(self.kv.save_seconds):
                await self.save_one(slot, tenant, unchanged=unchanged)

    async def save_one(
        self,
        slot: int,
        tenant: str = "",
        *,
        final: bool = False,
        unchanged: Callable[[], bool] | None = None,
    ) -> None:
        """``slot``'s cells into the store, as ``tenant``'s (``unchanged``: asked once the
        file is written, whether to keep it). Nothing half-saved stays: a failure or a
        cancellation leaves no file and no entry."""
        mlog = about(log, self.model)
        kv, ident, store = self.kv, self.ident, self.kv.store
        if ident is None or store is None:  # (only a child with the store's files has one)
            return
        name = store.new_name()
        path = store.slot_dir(ident) / f"{name}.bin"
        started = trio.current_time()
        entry: KvEntry | None = None
        try:
            target = f"/slots/{slot}?action=save"
            await kv.api.call(self.child, "POST", target, {"filename": path.name}, final=final)
            # The engine writes it with its umask: the conversation is the tenant's own.
            described = await trio.to_thread.run_sync(describe, path)
            if described is None:
                raise EngineCallFailed("the saved file is not a slot file")
            tokens, digest, size = described
            if len(tokens) < kv.min_tokens or (unchanged is not None and not unchanged()):
                path.unlink(missing_ok=True)  # cheap to compute again, or maybe not theirs
                return
            entry = KvEntry(ident, name, self.model, tokens, digest, size, 0.0, tenant)
            store.touch(entry)
            await trio.to_thread.run_sync(write_sidecar, entry, store.root)
        except BaseException as exc:
            path.unlink(missing_ok=True)  # (a full disk lands here too)
            if isinstance(exc, (OSError, EngineCallFailed)):
                mlog.warning("KV save of slot %d failed: %s", slot, exc)
                kv.metrics.saves.labels(self.model, "failed").inc()
                return
            if isinstance(exc, trio.Cancelled):
                mlog.warning("KV save of slot %d abandoned (over %gs)", slot, kv.save_seconds)
                kv.metrics.saves.labels(self.model, "abandoned").inc()
            raise
        kv.saved(entry, trio.current_time() - started, slot)
