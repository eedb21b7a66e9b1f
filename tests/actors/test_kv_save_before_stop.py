"""The KV save in a child's stop, with fake-engine children: it runs before the exit
command, and a save that overruns its bound is abandoned while the stop goes on."""

from __future__ import annotations

import trio

from troupe.sched import Status
from troupe_rig.router import RouterFactory, RunningRouter


async def test_an_overrunning_save_is_abandoned_and_the_stop_goes_on(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {}}) as router:
        kv = router.ctx.kv
        assert kv is not None
        kv.save_seconds = 0.2  # read into the child's launch spec when it starts
        entered, abandoned = trio.Event(), trio.Event()
        gens: list[int] = []

        async def hang(model: str, gen: int) -> None:
            gens.append(gen)
            entered.set()
            try:
                await trio.sleep_forever()
            finally:
                abandoned.set()

        kv.save_slots = hang  # type: ignore[method-assign]
        await router.ctx.scheduler.load("a")
        await router.wait_for_status("a", Status.LOADED)
        await router.ctx.scheduler.unload("a")
        await entered.wait()
        snap = await router.wait_for_status("a", Status.UNLOADED)
        assert abandoned.is_set()
        assert snap.models["a"].exit_code == 0
        assert len(gens) == 1  # that child's generation, once


def _record_saves(router: RunningRouter) -> list[str]:
    """The models whose stop asks the store to save, in order (the save itself skipped)."""
    kv = router.ctx.kv
    assert kv is not None
    saved: list[str] = []

    async def record(model: str, gen: int) -> None:
        saved.append(model)

    kv.save_slots = record  # type: ignore[method-assign]
    return saved


async def test_an_unload_saves_before_the_child_exits(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {}}) as router:
        saved = _record_saves(router)
        await router.ctx.scheduler.load("a")
        await router.wait_for_status("a", Status.LOADED)
        await router.ctx.scheduler.unload("a")  # an unload keeps what it holds
        await router.wait_for_status("a", Status.UNLOADED)
        assert saved == ["a"]


async def test_with_the_store_off_a_child_has_no_save_and_no_slot_path(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {}}, "--kv-store", "off") as router:
        assert router.ctx.kv is None
        await router.ctx.scheduler.load("a")
        await router.wait_for_status("a", Status.LOADED)
        entry = router.ctx.catalog.get("a")
        assert entry is not None
        assert "--slot-save-path" not in router.ctx.status_args(entry)


async def test_a_model_whose_preset_says_kv_store_off_is_left_out(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {"kv-store": "off"}, "b": {}}) as router:
        saved = _record_saves(router)
        for name in ("a", "b"):
            await router.ctx.scheduler.load(name)
            await router.wait_for_status(name, Status.LOADED)
        args = {}
        for name in ("a", "b"):
            entry = router.ctx.catalog.get(name)
            assert entry is not None
            args[name] = router.ctx.status_args(entry)
        assert "--slot-save-path" not in args["a"]
        assert "--no-cache-idle-slots" not in args["a"]
        assert "--slot-save-path" in args["b"]
        assert "--no-cache-idle-slots" in args["b"]
        for name in ("a", "b"):
            await router.ctx.scheduler.unload(name)
            await router.wait_for_status(name, Status.UNLOADED)
        assert saved == ["b"]  # a's stop saves nothing
