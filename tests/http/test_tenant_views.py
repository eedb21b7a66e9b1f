"""With a tenants file, the operator's views show a tenant that is not admin only what
its rights cover (real sockets, the fake engine): ``GET /metrics`` has no sample of a
model it may not use nor of another tenant, and ``GET /troupe/history`` no memory of such
a model; an admin sees everything."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from troupe.sched import Status
from troupe_rig.router import RouterFactory

KEYS = {"alice": "k-alice-1", "bob": "k-bob-2", "ops": "k-ops-3"}
FILE = """\
[[tenant]]
name = "alice"
key = "k-alice-1"
models = ["a"]

[[tenant]]
name = "bob"
key = "k-bob-2"

[[tenant]]
name = "ops"
key = "k-ops-3"
admin = true
"""


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


def labels(text: str, name: str) -> set[str]:
    """Every value of label ``name`` in the exposition (parsed by Prometheus' parser)."""
    return {
        s.labels[name]
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if name in s.labels
    }


async def test_metrics_and_history_show_only_what_the_tenant_may_use(
    fake_router: RouterFactory, tmp_path: Path
) -> None:
    path = tmp_path / "tenants.toml"
    path.write_text(FILE)
    async with (
        fake_router({"a": {}, "b": {}}, "--tenants", str(path)) as router,
        router.client() as http,
    ):
        for model, who in (("a", "alice"), ("b", "bob")):
            body: dict[str, Any] = {"model": model, "prompt": "x", "n_predict": 2}
            answer = await http.post("/completion", json=body, headers=auth(who))
            assert answer.status_code == 200, answer.text
        await router.wait_for_status("b", Status.LOADED)
        before = len(router.ctx.history.points())
        await router.ctx.history.wait_for(before + 1)

        everything = (await http.get("/metrics", headers=auth("ops"))).text
        assert {"a", "b"} <= labels(everything, "model")
        assert labels(everything, "tenant") == {"alice", "bob"}
        mine = (await http.get("/metrics", headers=auth("alice"))).text
        assert labels(mine, "model") == {"a"}
        assert labels(mine, "tenant") == {"alice"}
        assert "troupe_tenant_requests_total" in mine  # the families stay, its own series
        assert labels((await http.get("/metrics", headers=auth("bob"))).text, "model") >= {
            "a",
            "b",
        }

        admin = (await http.get("/troupe/history", headers=auth("ops"))).json()["points"][-1]
        assert set(admin["models"]) == {"a", "b"}
        alice = (await http.get("/troupe/history", headers=auth("alice"))).json()["points"][-1]
        assert set(alice["models"]) == {"a"}
        assert alice["memory_used"]  # the machine's figure stays (no model in it)
