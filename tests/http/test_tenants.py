"""Several named keys are several tenants, over real sockets: a conversation
belongs to the key that started it (another key meets it as an unknown id: the same
404, the same 204, nothing stopped), ``/troupe/*`` data needs a key and lists a tenant's
own records only, and only the dashboard's files stay public. With one key, nothing
changes."""

from __future__ import annotations

from pathlib import Path

import httpx
import trio

from troupe.sched import Status
from troupe_rig.router import RouterFactory

KEYS = {"alice": "k-alice", "bob": "k-bob"}
DATA_ROUTES = ("/troupe/requests", "/troupe/history", "/troupe/version")


def key_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys"
    path.write_text("".join(f"{name}:{key}\n" for name, key in KEYS.items()))
    return path


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name]}"}


async def test_another_keys_conversation_is_an_unknown_one(
    fake_router: RouterFactory, tmp_path: Path
) -> None:
    args = ("--named-api-keys", str(key_file(tmp_path)))
    async with (
        fake_router({"a": {"fake-load-time": "30"}}, *args) as router,
        router.client() as http,
    ):
        result: list[httpx.Response] = []
        headers = {**auth("alice"), "X-Conversation-Id": "conv-a"}
        async with trio.open_nursery() as nursery:

            async def ask() -> None:
                body = {"model": "a", "prompt": "x"}
                result.append(await http.post("/completion", json=body, headers=headers))

            nursery.start_soon(ask)
            await router.wait_for_status("a", Status.LOADING)
            unknown = await http.get(
                "/v1/stream", params={"conv_id": "never-seen"}, headers=auth("bob")
            )
            theirs = await http.get("/v1/stream", params={"conv_id": "conv-a"}, headers=auth("bob"))
            assert (theirs.status_code, theirs.content) == (404, unknown.content)
            found = await http.post(
                "/v1/streams/lookup", json={"conversation_ids": ["conv-a"]}, headers=auth("bob")
            )
            assert found.json() == []
            # Bob's stop of alice's id: answered as for an unknown id, and nothing stops.
            stop = await http.delete(
                "/v1/stream", params={"conv_id": "conv-a"}, headers=auth("bob")
            )
            assert (stop.status_code, stop.content) == (204, b"")
            mine = await http.get("/v1/stream", params={"conv_id": "conv-a"}, headers=auth("alice"))
            assert mine.status_code == 503  # hers, still waiting for its model
            assert mine.json()["error"]["message"] == "Stream owner model is loading, retry later"
            stop = await http.delete(
                "/v1/stream", params={"conv_id": "conv-a"}, headers=auth("alice")
            )
            assert stop.status_code == 204
        assert result[0].status_code == 400  # her own stop, not bob's, cancelled it
        message = result[0].json()["error"]["message"]
        assert message == "request cancelled by a stop while the model was loading"


async def test_troupe_data_needs_a_key_and_shows_a_tenant_its_own_records(
    fake_router: RouterFactory, tmp_path: Path
) -> None:
    args = ("--named-api-keys", str(key_file(tmp_path)))
    async with fake_router({"a": {}}, *args) as router, router.client() as http:
        for path in DATA_ROUTES:
            resp = await http.get(path)
            assert resp.status_code == 401, path
            assert resp.json()["error"]["type"] == "authentication_error"
            assert (await http.get(path, headers=auth("bob"))).status_code == 200, path
        # The dashboard's page and files hold no data: public.
        for path in ("/troupe/", "/troupe/index.html", "/troupe/dashboard.js"):
            assert (await http.get(path)).status_code == 200, path
        assert (await http.get("/troupe")).status_code == 308

        for who, conv in (("alice", "conv-alice"), ("bob", "conv-bob")):
            headers = {**auth(who), "X-Conversation-Id": conv}
            body = {"model": "a", "prompt": who, "n_predict": 2}
            assert (await http.post("/completion", json=body, headers=headers)).status_code == 200
        await router.ctx.requests.wait_until(lambda rec: rec.conversation == "conv-bob")
        for who in KEYS:
            resp = await http.get("/troupe/requests", params={"kind": "all"}, headers=auth(who))
            items = resp.json()["data"]
            assert items, who
            # Not another tenant's, nor the refused ones (no key: no tenant).
            assert {item["tenant"] for item in items} == {who}
            assert {item["conversation"] for item in items if item["conversation"]} == {
                f"conv-{who}"
            }


async def test_with_one_key_every_record_is_everyones(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {}}, "--api-key", "only") as router, router.client() as http:
        headers = {"Authorization": "Bearer only", "X-Conversation-Id": "c-1"}
        body = {"model": "a", "prompt": "x", "n_predict": 2}
        assert (await http.post("/completion", json=body, headers=headers)).status_code == 200
        await router.ctx.requests.wait_until(lambda rec: rec.conversation == "c-1")
        assert (await http.get("/troupe/requests")).status_code == 401
        resp = await http.get("/troupe/requests", headers={"X-Api-Key": "only"})
        [item] = resp.json()["data"]
        assert (item["conversation"], item["tenant"]) == ("c-1", "")
