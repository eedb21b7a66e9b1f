"""``GET /slots?model=``: a child's slots, each tenant seeing only its own requests there.

With one API key (or none) the child's answer is relayed as it is, byte for byte, as
upstream's router does. With several keys (tenants) the engine's answer would tell any
of them the prompt size, timing and sampling parameters of every other tenant's requests
(and their text, were ``LLAMA_SERVER_SLOTS_DEBUG`` set: troupe keeps it from such
children): troupe reads the child's slots itself and shows a slot's task only to the
tenant whose requests alone it can be about (the KV service's slot map knows who holds
each slot, `KvService.slots_seen_by`); to the others it is a slot with no task, idle.
``fail_on_no_slot`` then answers from that view, as the engine does from its own.
"""

from __future__ import annotations

import json
import logging

from troupe.actors.scheduler import ModelUnavailable
from troupe.assembly import Troupe
from troupe.http import access
from troupe.http.errors import error_body
from troupe.http.proxy_routes import handle_proxy_get
from troupe.http.respond import send_failure
from troupe.http.server.exchange import Exchange
from troupe.kvstore.engine_api import EngineCallFailed
from troupe.lease import Lease, autoload_flag

__all__ = ["slots"]

log = logging.getLogger("troupe.http")


async def slots(ctx: Troupe, ex: Exchange) -> None:
    kv = ctx.kv
    if kv is None or not ctx.tenants.current.private:
        await handle_proxy_get(ctx, ex)  # one tenant: the engine's answer as it is
        return
    rec, started = access.begin(ctx, ex)
    rec.model = ex.params.get("model", "")
    # GET is no use of the model: a dashboard polling /slots keeps none warm.
    held = Lease(
        ctx, rec.model, autoload=autoload_flag(ex.params, ctx.settings.models_autoload),
        update_last_used=False, tenant=rec.tenant, record=rec,
    )  # fmt: skip
    gone = False
    try:
        failure = held.check()
        if failure is not None:  # answered before the client is watched
            await send_failure(ex, failure)
            return

        async def work() -> None:
            try:
                async with held:
                    grant = held.grant
                    status, answer = await kv.api.fetch(grant, "GET", "/slots")
            except ModelUnavailable as exc:  # (the lease set the record's error)
                await send_failure(ex, exc.failure)
                return
            except EngineCallFailed as exc:
                log.warning("proxy error for %s %s: %s", held.model, ex.path, exc)
                rec.error = f"proxy error: {exc}"
                await ex.respond(500, rec.error.encode(), "text/plain")
                return
            if status != 200:  # the engine's error (--no-slots), as it said it
                await ex.respond(status, answer)
                return
            try:
                found = json.loads(answer)
            except ValueError:
                found = None
            if not isinstance(found, list):
                await ex.respond(500, error_body("unreadable /slots answer", "server_error"))
                return
            view = kv.slots_seen_by(grant.model, grant.gen, rec.tenant, found)
            if ex.params.get("fail_on_no_slot") and all(s.get("is_processing") for s in view):
                await ex.respond(503, error_body("no slot available", "unavailable_error"))
                return
            await ex.respond(200, json.dumps(view).encode())

        gone = await ex.until_client_leaves(work)
    finally:
        access.finish(ctx, ex, rec, started, None, client_left=gone)
