"""`KvService`: what the rest of troupe asks of the KV store.

- the launcher: `launch_args` (``--slot-save-path``, ``--swa-full`` for SWA models,
  ``--no-cache-idle-slots`` so an idle slot keeps its cells) and `measure_args` (the
  same KV layout, so the engine's projection counts it);
- the transport (`troupe.proxy.upstream.UpstreamPool`, which it watches): each child
  generation that starts gets its `SlotOwner` (`troupe.kvstore.owner`), dropped when the
  child exits; the owner holds the child's `SlotMap` and makes every save and restore,
  through the same transport, keyed by (model, generation);
- the instance actor's stop: `save_slots`, run before the exit command and bounded
  by the instance (a save that overruns is abandoned, the stop goes on);
- the request path: `held` (a parsed request: Ollama's, a realtime response's) or
  `steered` (the client's bytes), around a completion or chat request sent to a child:
  the request is held on a slot of the child's `SlotMap` (its conversation's own, or one
  it takes: the conversation there saved first, the stored entry sharing the longest
  prefix with the prompt restored), and sent to it (``id_slot``); the caller tells the
  `Hold` what the slot holds after the answer (`tokens_held`), so a slot too small to
  keep is later taken without a save. A request for a generation with no owner (its
  child gone, or never known) is sent as it came.

Entries are keyed by `kv_identity` of the child's exact argv, so they never cross into
a child whose KV layout differs.

``private`` (several API keys): entries and live slots are also keyed by the request's
tenant (its key's name). A request is restored only from its own tenant's entries and
continues only its own tenant's slot; one that must take a slot that may hold another
tenant's tokens is sent with ``"cache_prompt": false`` (`Hold.fresh`), so neither its
``cached_tokens`` nor its time to first token can tell what that slot held. Children
then run without the engine's RAM prompt cache (``--cache-ram 0``), which would hand one
tenant's cached prompt to another's request on any slot.

Without files (``store`` None: ``--kv-store off``; or a model whose preset has
``kv-store = off``) and several tenants, the slots are still steered the same way, only
nothing is saved or restored: the engine alone would give a request the slot whose cached
prompt it shares most with, whoever's it was, and its ``cached_tokens`` would say how far
another tenant's prompt matched. With one tenant and no files the store stays out of
the child and its requests altogether.

A restore checks itself: the first answer on a restored slot must show the restored
tokens reused (its ``timings.cache_n``). When the engine ignored it (hybrid and recurrent
models, a loaded ``--mmproj``, SWA without ``--swa-full``), the store stops saving and
restoring for that model's arguments, and says so (`restore_off`).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import asynccontextmanager
from typing import Any

from troupe.kvstore.bodies import (
    cached_held,
    cached_in,
    tokens_held,
    tokens_in,
    with_fields,
    with_slot,
    without_cache,
)
from troupe.kvstore.engine_api import EngineApi
from troupe.kvstore.identity import kv_identity
from troupe.kvstore.metrics import KvMetrics
from troupe.kvstore.owner import RESTORE_SECONDS, SLOTS_SECONDS, Hold, SlotOwner
from troupe.kvstore.replicas import Replicas
from troupe.kvstore.restore import route
from troupe.kvstore.store import KvEntry, KvStore
from troupe.modellog import about
from troupe.proxy.upstream import ChildRef, UpstreamPool

__all__ = [
    "RESTORE_SECONDS",
    "SLOTS_SECONDS",
    "Hold",
    "KvService",
    "cached_held",
    "cached_in",
    "tokens_held",
    "tokens_in",
    "with_slot",
    "without_cache",
]

log = logging.getLogger("troupe.kvstore")

MIN_TOKENS = 256  # a slot holding fewer cached tokens is cheap to compute again: not saved
SAVE_SECONDS = 10.0  # all of one stop's saves
# A larger body is not steered: parsing it holds the GIL from every client (small
# numbers: ~28 ms a MiB, so 2 MiB ~57 ms; 100 MiB: seconds). README, "Request bodies".
STEER_MAX_BODY = 2 << 20


class KvService:
    """The store's policy and files; one `SlotOwner` per running child generation,
    made and dropped as ``children`` (the one transport) reports them."""

    def __init__(
        self,
        store: KvStore | None,
        metrics: KvMetrics | None = None,
        *,
        children: UpstreamPool,
        min_tokens: int = MIN_TOKENS,
        save_seconds: float = SAVE_SECONDS,
        private: bool | Callable[[], bool] = False,
    ) -> None:
        self.store = store  # None: no files (--kv-store off), only the slots steered
        self.metrics = metrics or KvMetrics()
        self.min_tokens = min_tokens
        self.save_seconds = save_seconds
        # Several tenants (API keys): nothing crosses between them. A callable is read at
        # each use (the live tenant book: a reload may change it).
        if callable(private):
            self._privacy = private
        else:
            fixed = private
            self._privacy = lambda: fixed
        self._was_private = self._privacy()
        # Models whose running child was started for one tenant (its engine's RAM prompt
        # cache on): while tenants are kept apart, its requests are not steered and go
        # with "cache_prompt": false, until it restarts.
        self._shared: set[str] = set()
        # model -> (its KV identity, why): the engine ignored a restore into its child
        self._restore_off: dict[str, tuple[str, str]] = {}
        self._idents: dict[str, str] = {}  # model -> its running child's KV identity
        self._live: set[str] = set()  # models whose children's slots are steered
        self._keeps: dict[str, bool] = {}  # model -> its child keeps idle slots' cells
        self._owners: dict[str, SlotOwner] = {}  # model -> its running child's owner
        self.api = EngineApi(children)  # every call to a child, keyed by (model, gen)
        # In a cluster: saves pushed to the next nodes, misses asked of the peers.
        self.replicas: Replicas | None = None
        children.watch(self)

    # ----- the children, as the transport reports them ---------------------------------------

    def child_started(self, child: ChildRef) -> None:
        """A child started: its owner, with what its launch said (its KV identity, whether
        it keeps idle slots), when its slots are the store's to steer."""
        older = self._owners.pop(child.model, None)  # if that child's exit was not seen
        if older is not None:
            older.gone = True
        if child.model in self._live:
            ident = self._idents.get(child.model)
            keeps = self._keeps.get(child.model, True)
            self._owners[child.model] = SlotOwner(self, child, ident, keeps)

    def child_gone(self, model: str, gen: int) -> None:
        """A child exited: its owner goes with it (a request still holding a slot gives it
        back to a map nobody else sees)."""
        owner = self._owners.get(model)
        if owner is not None and owner.child.gen <= gen:
            owner.gone = True
            del self._owners[model]

    @property
    def private(self) -> bool:
        """Whether tenants are kept apart now. A change (the tenant book was replaced)
        reaches the running children's slot maps at once."""
        now = self._privacy()
        if now != self._was_private:
            self._was_private = now
            log.info("KV store: tenants are %s", "kept apart" if now else "one again")
            for owner in self._owners.values():
                if owner.map is not None:
                    owner.map.private = now
        return now

    def owner(self, model: str, gen: int) -> SlotOwner | None:
        """The owner of ``model``'s child ``gen`` while it runs; None for any other."""
        owner = self._owners.get(model)
        return owner if owner is not None and owner.child.gen == gen else None

    # ----- the launcher ----------------------------------------------------------------------

    @staticmethod
    def measure_args(args: list[str], swa: bool) -> list[str]:
        """``args`` with the KV layout the store needs (a SWA model keeps its full cache:
        the engine reuses nothing of a restored slot otherwise)."""
        if swa and "--swa-full" not in args:
            return [*args, "--swa-full"]
        return args

    def launch_args(
        self, model: str, args: list[str], swa: bool, *, files: bool = True
    ) -> list[str]:
        """``args`` for ``model``'s child. ``files``: its slots saved to the store and
        restored (not without a store); else, with several tenants, only steered (else
        left as they are)."""
        names = {a.split("=", 1)[0] for a in args}
        if "--slot-save-path" in names:
            # The user's own slot files: theirs to manage, the store keeps out of them.
            self.leave_out(model)
            return args
        store = self.store if files else None
        private = self.private
        if private:
            self._shared.discard(model)
        else:
            self._shared.add(model)
        if store is None:
            self.leave_out(model)
            if not private:
                return args  # one tenant: the child runs as it would without troupe's store
            self._live.add(model)
            return [*args, *self._slot_args(model, names)]
        full = self.measure_args(args, swa)
        ident = kv_identity(full)
        if self._idents.get(model) != ident:
            dropped = store.drop_model(model, keep_ident=ident)
            if dropped:
                about(log, model).info("dropped %d KV entries of its old arguments", dropped)
            self._update_gauges(model)
        self._idents[model] = ident
        self._live.add(model)
        slot_args = self._slot_args(model, names)
        return [*full, *slot_args, "--slot-save-path", str(store.slot_dir(ident))]

    def _slot_args(self, model: str, names: set[str]) -> list[str]:
        """What keeps an idle slot's cells for the next request of its conversation, and
        (several tenants) the engine's RAM prompt cache off."""
        # The engine's default moves every idle slot into its RAM cache (and clears it,
        # with a unified KV cache) whenever a task starts: no slot would keep its
        # conversation for the store to save or steer to. A preset that asks for it
        # keeps it, and the store then only restores into slots that never served.
        self._keeps[model] = "--cache-idle-slots" not in names
        keep = (
            []
            if names & {"--cache-idle-slots", "--no-cache-idle-slots"}
            else ["--no-cache-idle-slots"]
        )
        if self.private and not names & {"--cache-ram", "-cram"}:
            # The engine's RAM prompt cache loads whichever cached prompt best fits a
            # request, whoever's it was. (Without it no idle slot is cached either.)
            keep += ["--cache-ram", "0"]
            self._keeps[model] = True
        elif self.private:
            about(log, model).warning(
                "its --cache-ram shares cached prompts between API keys (tenants)"
            )
        return keep

    def leave_out(self, model: str) -> None:
        """``model``'s child runs without the store (its preset has ``kv-store = off``,
        or its own ``--slot-save-path``); its entries stay for when it is back on."""
        self._idents.pop(model, None)
        self._live.discard(model)

    def forget_models(self, known: Iterable[str]) -> None:
        """Models no longer in the catalog lose their entries."""
        if self.store is None:
            return
        known = set(known)
        models = {e.model for e in self.store.entries()}
        self.store.drop_unknown(known)
        for model in models:
            self._update_gauges(model)

    def refuses(self, model: str, path: str) -> bool:
        """Every client's slot action (``POST /slots/N``) on a child whose slot path is the
        store's, as the engine answers a child without a slot path (any action): a save or
        a restore would write (and read) files the store owns, outside its budget, and an
        erase empties a slot the store steers to. All of them, whatever the query says:
        the engine strips a ``#fragment``, takes the last of repeated keys and reads a
        form-encoded body's fields as well, so no reading of ``action`` here can be sure
        to be the engine's. A child with the user's own ``--slot-save-path`` is theirs."""
        return model in self._idents and "/slots/" in path

    def _loose(self, model: str, gen: int) -> contextlib.AbstractContextManager[None]:
        """A request the engine places itself on ``model``'s child ``gen`` (`SlotMap.loose`)."""
        owner = self.owner(model, gen)
        return contextlib.nullcontext() if owner is None else owner.loose()

    def slots_seen_by(self, model: str, gen: int, tenant: str, slots: Any) -> Any:
        """The child's ``GET /slots`` answer as ``tenant`` may see it (several tenants):
        a slot whose last or current task may be another tenant's (or whose is unknown)
        is shown as the engine shows a slot that never served: its ``id``, ``n_ctx`` and
        ``speculative``, not processing, with no task (no prompt size, parameters or
        text). With one tenant, or an answer that is not a list, as it came."""
        if not self.private or not isinstance(slots, list):
            return slots
        owner = self.owner(model, gen)
        out: list[Any] = []
        for slot in slots:
            if not isinstance(slot, dict):
                continue
            sid = slot.get("id")
            if owner is not None and isinstance(sid, int) and owner.shows(sid, tenant):
                out.append(slot)
                continue
            idle = {k: slot[k] for k in ("id", "n_ctx", "speculative") if k in slot}
            out.append({**idle, "is_processing": False})
        return out

    def usage(self, model: str) -> tuple[int, int]:
        return (0, 0) if self.store is None else self.store.usage(model)

    # ----- before a stop -----------------------------------------------------------------------

    async def save_slots(self, model: str, gen: int) -> None:
        """Before the stop of ``model``'s child ``gen``: its owner saves every idle slot
        that holds enough tokens (and claims none from now on)."""
        owner = self.owner(model, gen)
        if owner is not None:
            await owner.save_all()

    def saved(self, entry: KvEntry, seconds: float, slot: int) -> None:
        """A slot's save, written and described (`SlotOwner.save_one`): into the store,
        older entries dropped to stay within its budget, counted; in a cluster, pushed
        to the model's next nodes (`Replicas.saved`)."""
        model = entry.model
        gone = self.stored(entry)
        if self.replicas is not None:
            self.replicas.saved(entry)
        self.metrics.saves.labels(model, "saved").inc()
        self.metrics.bytes.labels(model, "saved").inc(entry.size)
        self.metrics.save_seconds.labels(model).observe(seconds)
        about(log, model).info(
            "KV: saved slot %d (%d tokens, %.1f MiB) in %.0f ms%s",
            slot,
            len(entry.tokens),
            entry.size / (1 << 20),
            seconds * 1000,
            f"; {len(gone)} older entries dropped" if gone else "",
        )

    def stored(self, entry: KvEntry) -> list[KvEntry]:
        """``entry`` (its files and sidecar written) indexed: the entries it displaced."""
        assert self.store is not None
        gone = self.store.add(entry)
        for model in {e.model for e in gone} | {entry.model}:
            self._update_gauges(model)
        return gone

    # ----- around a request ------------------------------------------------------------------

    @asynccontextmanager
    async def steered(
        self,
        model: str,
        gen: int,
        path: str,
        body: bytes,
        conv: str = "",
        *,
        tenant: str = "",
    ) -> AsyncIterator[Hold]:
        """`held` for bytes: the hold's ``body`` is what to send to the child; any
        trouble, or a body that is not a JSON object, leaves it as it came (``private``:
        with ``"cache_prompt": false``, whatever the route)."""
        kind = route(path)
        request: Any = None
        steer = kind is not None and len(body) <= STEER_MAX_BODY
        steer = steer and self.owner(model, gen) is not None
        private = self.private
        if private and model in self._shared:
            steer = False  # a child started for one tenant (its RAM prompt cache on)
        if not steer and private:
            # Not steered (any route): the engine picks the slot, which may hold anyone's
            # tokens. The body is not parsed for it (it may be large).
            with self._loose(model, gen):
                yield Hold(None, without_cache(body), fresh=True)
            return
        if steer:
            with contextlib.suppress(ValueError, RecursionError):
                request = json.loads(body)
        if not isinstance(request, dict):
            with self._loose(model, gen):
                yield Hold(None, without_cache(body) if self.private else body, fresh=self.private)
            return
        async with self.held(model, gen, path, request, conv, tenant=tenant) as hold:
            fields = hold.fields()
            hold.body = with_fields(body, request, fields) if fields else body
            yield hold

    @asynccontextmanager
    async def held(
        self,
        model: str,
        gen: int,
        path: str,
        request: dict[str, Any],
        conv: str = "",
        *,
        tenant: str = "",
    ) -> AsyncIterator[Hold]:
        """The slot ``request`` is to run on (sent as ``id_slot``), held until the block
        exits: the slot of its conversation when that is still on one; else an empty
        slot, or the least recently used idle one (its conversation saved to the store
        first), with the stored entry sharing the longest prefix with the prompt
        restored into it. No slot: sent as it is (not steered, or the client chose).
        ``tenant``: whose request it is (``private``: the key's name); what `Hold.fields`
        says is added to the request before it is sent."""
        private = self.private
        if not private:
            tenant = ""
        kind = route(path)
        owner = self.owner(model, gen)  # None: not steered, or its child is gone
        if private and model in self._shared:
            owner = None  # a child started for one tenant (its RAM prompt cache on)
        if owner is None or kind is None or _several_tasks(request):
            # Not steered, with several tenants: the engine picks a slot (or the client
            # did) that may hold anyone's tokens, and reuses them unless told not to.
            with self._loose(model, gen):  # (several tasks: the engine spreads them itself)
                yield Hold(None, fresh=self.private)
            return
        async with owner.held(kind, request, conv, tenant) as hold:
            yield hold

    # ----- whether restores work ---------------------------------------------------------------

    def restore_off(self, model: str) -> str | None:
        """Why the store no longer restores (nor saves) for ``model``'s child; None: it does."""
        off = self._restore_off.get(model)
        return off[1] if off is not None and off[0] == self._idents.get(model) else None

    def check_restore(self, model: str, ident: str, shared: int, cached: int | None) -> None:
        """The first answer on a slot restored with ``shared`` tokens of its prompt reused
        ``cached`` of them (None: it did not say, nothing learnt)."""
        if cached is None or cached > 0 or self._idents.get(model) != ident:
            return
        why = (
            f"the engine reused none of {shared} restored tokens (hybrid or recurrent "
            "models, a loaded --mmproj, or SWA without --swa-full cannot reuse a restored slot)"
        )
        self._restore_off[model] = (ident, why)
        self.metrics.restores.labels(model, "ignored").inc()
        about(log, model).warning("KV: restores switched off for this model: %s", why)

    def _update_gauges(self, model: str) -> None:
        entries, size = self.usage(model)
        self.metrics.stored_entries.labels(model).set(entries)
        self.metrics.stored_bytes.labels(model).set(size)


def _several_tasks(request: dict[str, Any]) -> bool:
    """A request the engine runs as several tasks (prompts in a list, ``n`` > 1): held
    on one slot they would run one after another."""
    prompt = request.get("prompt")
    batch = isinstance(prompt, list) and any(not isinstance(p, int) for p in prompt)
    return batch or request.get("n", 1) not in (1, None)
