"""One request's lease on its model's child: the request policy every front door shares.

The OpenAI routes (`troupe.http.proxy_routes`), Ollama's (`troupe.ollama.common`) and a
realtime session's responses (`troupe.realtime.lease`) all hold a child this way::

    async with Lease(ctx, name, autoload=autoload, ...) as held:
        async with held.slot(path, body) as hold:  # the KV store's slot (None: no store)
            ...  # send to held.grant

In this order, each written here once:

1. the model is validated (`validate_model`: missing, unknown, rejected, not loaded
   without ``?autoload``; `autoload_flag` reads the query);
1b. the tenant's rate limits and token budget admit it, or it is refused with 429 and
   never queues (`troupe.tenants.usage.Accounts.admit`: tokens reserved from the body
   in the same step as the check); the reservation is settled from the engine's counts
   when the request's access record ends (or here, for a request without one), and
   given back whole if the request never reached the child;
2. a conversation a stop may cancel (``stoppable``) gets its ticket, and its wait is
   shielded from the client (a page reload must not cancel the load), cancelled only by
   a stop of the conversation;
3. the wait is bounded by ``--queue-timeout`` (`acquire_within`);
4. the wait is counted: the queue-wait histogram and the access record's queue and load
   parts (`note_wait`);
5. ``keep_alive`` (Ollama's) goes to the scheduler while the lease is held, so the
   release that follows applies it;
6. ``--fake-timing``'s delay (the child counted busy meanwhile, like upstream);
7. the KV store's slot (`Lease.slot`), held while the child answers;
8. the release, shielded, whatever ends the block.

A refusal raises `ModelUnavailable` with upstream's failure (and sets the access
record's error); each door keeps only its translation: llama.cpp's JSON error on the
OpenAI routes, Ollama's ``{"error": ...}`` on /api/*, a realtime ``error`` event.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, NoReturn

import trio

from troupe.actors.scheduler import ModelUnavailable
from troupe.assembly import Troupe
from troupe.catalog import ModelEntry
from troupe.kvstore import Hold
from troupe.ops.access import AccessRecord
from troupe.sched import FAKE_TIMING_DELAY, Failure, Grant
from troupe.sched.terms import DEFAULT_TERMS, TenantTerms
from troupe.tenants.budget import Refusal, Reservation, rate_headers

__all__ = [
    "NO_SLOT",
    "NO_SLOT_PATHS",
    "Lease",
    "acquire_within",
    "autoload_flag",
    "note_wait",
    "takes_slot",
    "validate_model",
]

STOPPED = "request cancelled by a stop while the model was loading"

# The slot of a request the KV store does not hold (no store, or not a POST): reusable,
# so such a request allocates nothing for it.
NO_SLOT: AbstractAsyncContextManager[Hold | None] = contextlib.nullcontext(None)


def autoload_flag(params: Mapping[str, str], default: bool) -> bool:
    """``?autoload=``: empty means the server setting; else true only for "true" or "1"."""
    value = params.get("autoload", "")
    return default if value == "" else value in ("true", "1")


def validate_model(
    ctx: Troupe, name: str, autoload: bool, tenant: str = ""
) -> ModelEntry | Failure:
    """upstream ``router_validate_model``: missing, unknown, or not loaded without autoload.
    A model ``tenant`` may not use (its tenants file's ``models``) is one that is unknown."""
    if not name:
        return Failure.bad_request("model name is missing from the request")
    entry = ctx.catalog.resolve(name)
    if entry is None or not ctx.tenants.current.allows(tenant, (entry.name, *entry.aliases)):
        return Failure.bad_request(f"model '{name}' not found")
    rejected = ctx.rejection(entry)
    if rejected:
        return Failure.bad_request(f"model '{entry.name}' cannot be served: {rejected}")
    if not autoload and (refused := ctx.scheduler.not_loaded(entry.name)) is not None:
        return refused  # the scheduler's answer, asked (it is acquire's own)
    return entry


# Requests that occupy none of a child's slots (a POST that does not decode, and every
# GET): never counted against the slots, never queued behind requests that are.
NO_SLOT_PATHS = frozenset(
    {"/tokenize", "/detokenize", "/apply-template", "/props", "/health", "/v1/health",
     "/slots", "/metrics", "/models", "/v1/models", "/lora-adapters",
     "/v1/messages/count_tokens", "/chat/completions/input_tokens",
     "/v1/chat/completions/input_tokens", "/responses/input_tokens",
     "/v1/responses/input_tokens", "/v1/chat/completions/control"}
)  # fmt: skip


def takes_slot(method: str, path: str) -> bool:
    """Does a request occupy one of the child's slots while it is answered (completions,
    chat, infill, embeddings, rerank, Ollama's chat/generate/embed)?"""
    if method != "POST":
        return False
    path = path.split("?", 1)[0].rstrip("/")
    return path not in NO_SLOT_PATHS and not path.startswith("/slots/")


async def acquire_within(
    ctx: Troupe,
    model: str,
    *,
    autoload: bool,
    update_last_used: bool,
    terms: TenantTerms = DEFAULT_TERMS,
    slot: bool = False,
) -> tuple[int, Grant]:
    """`Scheduler.acquire` bounded by ``--queue-timeout``: a wait that lasts longer
    leaves the queue and fails with a clear 503."""
    timeout = ctx.settings.queue_timeout
    if timeout is None:
        return await ctx.scheduler.acquire(
            model, autoload=autoload, update_last_used=update_last_used, terms=terms, slot=slot
        )
    with trio.move_on_after(timeout):
        return await ctx.scheduler.acquire(
            model, autoload=autoload, update_last_used=update_last_used, terms=terms, slot=slot
        )
    view = ctx.scheduler.snapshot.models.get(model)
    state = f" (it is {view.status})" if view is not None else ""
    raise ModelUnavailable(
        Failure.unavailable(f"timed out after {timeout:g} s waiting for model {model}{state}")
    )


def note_wait(ctx: Troupe, rec: AccessRecord, waited: float, grant: Grant | None) -> None:
    """Split a wait for the model into its queue part and its load part: a grant that
    waited for a load spent the model's last load time (spawn to ready) loading."""
    if grant is not None and grant.waited:
        view = ctx.scheduler.snapshot.models.get(grant.model)
        load = view.last_load_seconds if view is not None else None
        load = min(waited, load) if load is not None else waited
        rec.load_wait, rec.queue_wait = load, max(0.0, waited - load)
    else:
        rec.queue_wait, rec.load_wait = waited, 0.0


class Lease:
    """``async with Lease(...) as held``: ``held.grant`` is the child, held until the
    block exits (see the module's docstring for what entering does, in order).

    ``model``: the name the request gives (validated and resolved unless ``validate``
    is False: a realtime session's model was validated at its handshake).
    ``tenant``: whose request it is (`troupe.http.keys.tenant_of`); ``conversation``:
    its conversation id (the KV store's slot, and with ``stoppable`` its ticket).
    ``record``: the access record to fill in (model, waits, refusal).
    ``body``: the request's JSON, for a tenant with a token limit (its cost: max_tokens
    and the prompt's estimate). ``rate_fields``: the ``x-ratelimit-*`` header lines for
    the answer, once admitted (empty when the tenant has no limit). ``used``: the tokens
    the answer counted, for a door without an access record (None: unknown).
    """

    __slots__ = (
        "_reservation",
        "_rid",
        "_validate",
        "autoload",
        "body",
        "conversation",
        "ctx",
        "grant",
        "keep_alive",
        "model",
        "rate_fields",
        "record",
        "stoppable",
        "tenant",
        "update_last_used",
        "used",
        "uses_slot",
        "waited",
    )

    def __init__(
        self,
        ctx: Troupe,
        model: str,
        *,
        autoload: bool,
        update_last_used: bool = True,
        tenant: str = "",
        conversation: str = "",
        stoppable: bool = False,
        keep_alive: float | None = None,
        record: AccessRecord | None = None,
        validate: bool = True,
        body: bytes = b"",
        uses_slot: bool | None = None,
    ) -> None:
        self.ctx = ctx
        self.model = model
        self.autoload = autoload
        self.update_last_used = update_last_used
        self.tenant = tenant
        self.conversation = conversation
        self.stoppable = stoppable
        self.keep_alive = keep_alive
        self.record = record
        # It occupies one of the child's slots, so it waits its turn while they are all
        # taken (fair queuing); None: from the record's method and path (none: it does).
        if uses_slot is None:
            uses_slot = record is None or takes_slot(record.method, record.path)
        self.uses_slot = uses_slot
        self._validate = validate
        self.waited = 0.0  # seconds from asking to the grant (or the refusal)
        self._rid = 0
        self.grant: Grant
        self.body = body
        self.rate_fields = b""
        self.used: int | None = None
        self._reservation: Reservation | None = None

    def check(self) -> Failure | None:
        """Validate the model now (entering then does not again): the refusal, if any,
        for a door that answers it before it watches the client."""
        self._validate = False
        checked = validate_model(self.ctx, self.model, self.autoload, self.tenant)
        if isinstance(checked, Failure):
            if self.record is not None:
                self.record.error = checked.message
            return checked
        self.model = checked.name
        if self.record is not None:
            self.record.model, self.record.catalogd = checked.name, True
        return None

    async def __aenter__(self) -> Lease:
        ctx = self.ctx
        if self._validate and (failure := self.check()) is not None:
            raise ModelUnavailable(failure)
        if self.tenant:
            self._admit()  # before the wait: a request over its limits never queues
        try:
            rid, grant = await self._wait()
        except BaseException:
            self._give_back()
            raise
        try:
            if self.keep_alive is not None:
                # Set while the lease is held (no TTL runs while a request is in flight),
                # so the release applies it; in effect before the answer, so a client
                # that asks /api/ps right after sees it.
                await ctx.scheduler.keep_alive(grant.model, grant.gen, self.keep_alive)
            if ctx.fake_timing:
                await trio.sleep(FAKE_TIMING_DELAY)  # counted busy meanwhile, like upstream
        except BaseException:
            self._give_back()
            await ctx.scheduler.release(rid)
            raise
        self._rid, self.grant = rid, grant
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.ctx.scheduler.release(self._rid, self._answer_tokens())
        reservation, self._reservation = self._reservation, None
        if reservation is not None:
            accounts = self.ctx.accounts
            if self.record is not None:  # settled from the record's figures as it ends
                accounts.settle_with(self.record, reservation)
            else:
                accounts.settle(reservation, self.used)

    def _answer_tokens(self) -> int | None:
        """The tokens the answer used, prompt + generated (`used`, else the access
        record's figures; None: unknown), for the tenant's attained service."""
        if self.used is not None:
            return self.used
        rec = self.record
        if rec is None or (rec.prompt_tokens is None and rec.completion_tokens is None):
            return None
        return (rec.prompt_tokens or 0) + (rec.completion_tokens or 0)

    def _admit(self) -> None:
        """The tenant's limits: reserve, or refuse with 429 (no await in between)."""
        accounts = self.ctx.accounts
        limits = accounts.limits(self.tenant)
        if limits is None:
            return
        verdict = accounts.admit(self.tenant, limits, self.body)
        if isinstance(verdict, Refusal):
            self.ctx.metrics.observe_rejected(self.tenant, verdict.reason)
            headers = rate_headers(verdict.quota)
            if verdict.retry:
                ms = b"%d" % max(1, round(verdict.retry_after * 1000))
                headers.append((b"retry-after-ms", ms))
            else:  # the official SDKs retry a 429 unless told not to
                headers.append((b"x-should-retry", b"false"))
            self._refuse(
                Failure(
                    429, verdict.message, verdict.type, retry_after=verdict.retry_after,
                    code=verdict.code, headers=tuple(headers),
                )
            )  # fmt: skip
        self._reservation = verdict.reservation
        self.rate_fields = b"".join(k + b": " + v + b"\r\n" for k, v in rate_headers(verdict.quota))

    def _give_back(self) -> None:
        """The request never reached the child: its reserved tokens go back whole."""
        reservation, self._reservation = self._reservation, None
        if reservation is not None:
            self.ctx.accounts.settle(reservation, 0)

    def slot(
        self, path: str, body: bytes | dict[str, Any]
    ) -> AbstractAsyncContextManager[Hold | None]:
        """The KV store's slot of the child for this request, held inside the block
        (`troupe.kvstore.KvService`): its conversation's, or one whose conversation the
        store saved first, this one's stored entry restored into it (bounded; any trouble
        leaves it as it came). With several keys, only this tenant's conversations.
        ``body``: the client's bytes (the hold's ``body`` is what to send) or a parsed
        request (`Hold.fields` is what to add). None: no KV store."""
        kv = self.ctx.kv
        if kv is None:
            return NO_SLOT
        grant = self.grant
        if isinstance(body, bytes):
            return kv.steered(
                grant.model, grant.gen, path, body, self.conversation, tenant=self.tenant
            )
        return kv.held(grant.model, grant.gen, path, body, self.conversation, tenant=self.tenant)

    async def _wait(self) -> tuple[int, Grant]:
        ctx, model = self.ctx, self.model
        tracker, conv, owner = ctx.conversations, self.conversation, self.tenant
        terms = ctx.tenants.current.terms(self.tenant)  # its weight, class, max_parallel
        asked = trio.current_time()
        granted: Grant | None = None
        # Registered before the wait, so a stop issued while the model loads can cancel it.
        ticket = tracker.remember(conv, model, owner=owner) if self.stoppable and conv else 0
        stopped = False
        outcome = "cancelled"  # a wait that ends in neither a grant nor a failure
        refused: Failure | None = None
        try:
            # A conversation's wait ignores the client going away (a page reload must not
            # cancel the load); only a stop of the conversation cancels it.
            if ticket:
                with trio.CancelScope(shield=True) as wait_scope:
                    tracker.attach(conv, ticket, wait_scope, owner=owner)
                    rid, granted = await acquire_within(
                        ctx, model, autoload=self.autoload,
                        update_last_used=self.update_last_used, terms=terms, slot=self.uses_slot,
                    )  # fmt: skip
                stopped = wait_scope.cancelled_caught
            else:
                rid, granted = await acquire_within(
                    ctx, model, autoload=self.autoload,
                    update_last_used=self.update_last_used, terms=terms, slot=self.uses_slot,
                )  # fmt: skip
        except ModelUnavailable as exc:
            outcome, refused = "failed", exc.failure
        except Exception:
            outcome = "failed"
            raise
        finally:
            if ticket:
                tracker.detach(conv, ticket, owner=owner)
            # One clock read for the wait's histogram and the access record.
            waited = self.waited = trio.current_time() - asked
            ctx.metrics.observe_queue_wait(
                model, "granted" if granted is not None else outcome, waited
            )
            if self.record is not None:
                note_wait(ctx, self.record, waited, granted)
        if refused is not None:
            self._refuse(refused)
        if ticket and (stopped or not tracker.alive(conv, ticket, owner=owner)):
            if not stopped:
                await ctx.scheduler.release(rid)
            self._refuse(Failure.bad_request(STOPPED))
        assert granted is not None
        return rid, granted

    def _refuse(self, failure: Failure) -> NoReturn:
        if self.record is not None:
            self.record.error = failure.message
        raise ModelUnavailable(failure)
