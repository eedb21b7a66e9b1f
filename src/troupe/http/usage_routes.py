"""``GET /troupe/usage``: what each tenant used, per UTC day and model, to bill from.

Rows come from the usage ledger (`troupe.tenants.usage.Usage`): requests served and the
tokens the engine counted (prompt and generated), and a row of model "" per day for
requests refused by a limit (``rejected``, by reason). ``totals`` sums the rows per
tenant; ``budgets`` shows each limited tenant's limits and what is left of them now.
``?tenant=``, ``?model=``, ``?from=`` and ``?to=`` (``YYYY-MM-DD``, UTC, inclusive)
narrow it. It needs a key when keys are set; a tenant that is not admin sees only its
own (`troupe.http.keys.viewer_of`).
"""

from __future__ import annotations

import calendar
import time
from typing import Any

from troupe.assembly import Troupe
from troupe.http.keys import viewer_of
from troupe.http.respond import send_error, send_json
from troupe.http.server.exchange import Exchange
from troupe.tenants.budget import DAY, Quota, limited

__all__ = ["usage"]


def _day(text: str) -> int | None:
    try:
        return calendar.timegm(time.strptime(text, "%Y-%m-%d")) // DAY
    except ValueError:
        return None


async def usage(router: Troupe, ex: Exchange) -> None:
    params = ex.params
    viewer = viewer_of(router.tenants.current, ex.request.key_name)
    asked = params.get("tenant", "")
    bounds: list[int | None] = []
    for name in ("from", "to"):
        text = params.get(name, "")
        day = _day(text) if text else None
        if text and day is None:
            await send_error(ex, f"{name} must be a day as YYYY-MM-DD", "invalid_request_error")
            return
        bounds.append(day)
    first, last = bounds

    def shown(tenant: str) -> bool:
        return (not viewer or tenant == viewer) and (not asked or tenant == asked)

    accounts = router.accounts
    model = params.get("model", "")
    rows = accounts.usage.rows(shown, first or 0, last)
    if model:
        rows = [r for r in rows if r["model"] == model]
    totals: dict[str, dict[str, Any]] = {}
    for row in rows:
        total = totals.setdefault(
            row["tenant"],
            {"tenant": row["tenant"], "requests": 0, "prompt_tokens": 0, "completion_tokens": 0},
        )
        for key in ("requests", "prompt_tokens", "completion_tokens"):
            total[key] += row[key]
        for reason, count in row.get("rejected", {}).items():
            rejected = total.setdefault("rejected", {})
            rejected[reason] = rejected.get(reason, 0) + count
    for total in totals.values():
        total["total_tokens"] = total["prompt_tokens"] + total["completion_tokens"]
    budgets = []
    now = accounts.clock()
    for tenant in router.tenants.current.tenants:
        if not shown(tenant.name) or not limited(tenant.limits):
            continue
        quota = accounts.budgets.quota(tenant.name, tenant.limits, now)
        budgets.append({"tenant": tenant.name, **_budget(quota)})
    await send_json(
        ex,
        {
            "object": "usage",
            "data": rows,
            "totals": [totals[name] for name in sorted(totals)],
            "budgets": budgets,
        },
    )


def _budget(quota: Quota) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if quota.limit_requests is not None:
        out["requests_per_minute"] = {
            "limit": quota.limit_requests,
            "remaining": quota.remaining_requests,
            "reset_seconds": round(quota.reset_requests, 3),
        }
    if quota.limit_tokens is not None:
        out["tokens_per_minute"] = {
            "limit": quota.limit_tokens,
            "remaining": quota.remaining_tokens,
            "reset_seconds": round(quota.reset_tokens, 3),
        }
    if quota.limit_day is not None:
        out["tokens_per_day"] = {
            "limit": quota.limit_day,
            "remaining": quota.remaining_day,
            "reset_seconds": round(quota.reset_day, 3),
        }
    return out
