"""Instance and scheduler actors running real (fake-engine) child processes."""

from __future__ import annotations

import os
import signal

import psutil
import pytest
import trio

from troupe.actors.scheduler import ModelUnavailable
from troupe.sched import Status
from troupe_rig.events import collect_until, drain
from troupe_rig.router import RouterFactory


async def test_load_ready_unload_exit_zero(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {}}) as router:
        with router.ctx.scheduler.subscribe() as events:
            await router.ctx.scheduler.load("a")
            snap = await router.wait_for_status("a", Status.LOADED)
            pid = snap.models["a"].pid
            assert psutil.pid_exists(pid)
            await router.ctx.scheduler.unload("a")
            snap = await router.wait_for_status("a", Status.UNLOADED)
            assert snap.models["a"].exit_code == 0
            assert not snap.models["a"].failed
            got = await collect_until(
                events, lambda e: e.get("data") == {"status": "unloaded", "exit_code": 0}
            )
            seen = [(e["event"], (e.get("data") or {}).get("status")) for e in got]
        assert seen[0] == ("model_status", "loading")
        assert ("status_change", "loaded") in seen
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


async def test_sigkilled_child_is_failed_with_exit_code_1_and_loads_again(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {}}) as router:
        await router.ctx.scheduler.load("a")
        snap = await router.wait_for_status("a", Status.LOADED)
        os.kill(snap.models["a"].pid, signal.SIGKILL)
        snap = await router.wait_for_status("a", Status.UNLOADED)
        view = snap.models["a"]
        assert view.failed
        assert view.exit_code == 1
        assert view.last_error is not None
        assert "SIGKILL" in view.last_error
        await router.ctx.scheduler.load("a")
        snap = await router.wait_for_status("a", Status.LOADED)
        assert not snap.models["a"].failed


async def test_stubborn_child_is_gone_after_stop_timeout_plus_term_grace(
    fake_router: RouterFactory,
) -> None:
    sections = {
        "a": {
            "fake-ignore-exit": "1",
            "fake-ignore-sigterm": "1",
            "stop-timeout": "1",
            "term-grace": "1",
        }
    }
    async with fake_router(sections) as router:
        await router.ctx.scheduler.load("a")
        await router.wait_for_status("a", Status.LOADED)
        start = trio.current_time()
        await router.ctx.scheduler.unload("a")
        with trio.fail_after(1 + 1 + 3):  # stop-timeout + term-grace + slack for a loaded machine
            snap = await router.wait_for_status("a", Status.UNLOADED)
        # It took the whole ladder (it ignored both requests), and SIGKILL is reported as 1.
        assert trio.current_time() - start >= 2
        assert snap.models["a"].exit_code == 1


async def test_unload_while_loading_kills_at_once(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {"fake-load-time": "30", "fake-ignore-exit": "1"}}) as router:
        await router.ctx.scheduler.load("a")
        await router.wait_for_status("a", Status.LOADING)
        await router.ctx.scheduler.unload("a")
        with trio.fail_after(5):
            snap = await router.wait_for_status("a", Status.UNLOADED)
        assert snap.models["a"].failed  # upstream: a killed load reports exit code 1
        assert snap.models["a"].exit_code == 1


async def test_crash_during_load_fails_waiters_with_the_log_tail(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {"fake-load-crash": "3"}}) as router:
        with pytest.raises(ModelUnavailable) as caught:
            async with router.ctx.scheduler.lease("a"):
                pass
        failure = caught.value.failure
        assert failure.status == 500
        assert failure.message.startswith("model name=a failed to load")
        assert "exit code 3" in failure.message


async def test_oom_during_load_is_reported(fake_router: RouterFactory) -> None:
    async with fake_router({"a": {"fake-oom": "1"}}) as router:
        with pytest.raises(ModelUnavailable) as caught:
            async with router.ctx.scheduler.lease("a"):
                pass
        assert "out of memory" in caught.value.failure.message


async def test_crash_loop_holds_the_model_back_until_an_explicit_load(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {"fake-load-crash": "1"}}) as router, router.client() as http:

        async def shown() -> tuple[str, str, bool]:
            """GET /models' words for ``a``: the lifecycle's and llama.cpp's status."""
            a = next(m for m in (await http.get("/models")).json()["data"] if m["id"] == "a")
            return a["troupe"]["phase"], a["status"]["value"], a["status"].get("failed", False)

        for crash in range(3):
            with pytest.raises(ModelUnavailable) as caught:
                async with router.ctx.scheduler.lease("a"):
                    pass
            assert "failed to load" in caught.value.failure.message
            if crash == 0:
                # A failure is data beside the phase (its exit code); /models still says
                # "failed", as when it was a phase of its own.
                await router.ctx.scheduler.wait_until(lambda s: s.models["a"].failed)
                assert await shown() == ("failed", "unloaded", True)
        # Held back: the fourth request fails fast without spawning anything.
        with pytest.raises(ModelUnavailable) as caught:
            async with router.ctx.scheduler.lease("a"):
                pass
        assert caught.value.failure.status == 503
        assert "held back" in caught.value.failure.message
        assert router.snapshot.models["a"].held_until is not None
        assert await shown() == ("held", "unloaded", True)
        # An explicit load lifts the hold.
        await router.ctx.scheduler.load("a")
        assert router.snapshot.models["a"].held_until is None


async def test_one_model_crashing_never_disturbs_another(fake_router: RouterFactory) -> None:
    sections = {"good": {}, "bad": {"fake-load-crash": "1"}}
    async with fake_router(sections) as router, router.ctx.scheduler.lease("good") as grant:
        with pytest.raises(ModelUnavailable):
            async with router.ctx.scheduler.lease("bad"):
                pass
        assert router.status("good") is Status.LOADED
        assert grant.port == router.snapshot.models["good"].port


async def test_shutdown_stops_every_child(fake_router: RouterFactory) -> None:
    pids = []
    async with fake_router({"a": {}, "b": {}, "c": {}}, "--models-max", "0") as router:
        for name in ("a", "b", "c"):
            await router.ctx.scheduler.load(name)
        for name in ("a", "b", "c"):
            snap = await router.wait_for_status(name, Status.LOADED)
            pids.append(snap.models[name].pid)
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


async def test_a_bug_in_one_models_actor_fails_that_model_only(fake_router: RouterFactory) -> None:
    async with fake_router({"good": {}, "cursed": {}}) as router:
        render = router.ctx.specs.render_args

        def broken(entry, port):  # type: ignore[no-untyped-def]
            if entry.name == "cursed":
                raise RuntimeError("a bug in rendering")
            return render(entry, port)

        router.ctx.specs.render_args = broken  # type: ignore[method-assign]
        with pytest.raises(ModelUnavailable) as caught:
            async with router.ctx.scheduler.lease("cursed"):
                pass
        assert "troupe instance error" in caught.value.failure.message
        assert "a bug in rendering" in caught.value.failure.message
        async with router.ctx.scheduler.lease("good") as grant:
            assert grant.port == router.snapshot.models["good"].port


async def test_an_oom_load_is_retried_once_after_evicting_idle_models(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"idle": {}, "big": {"fake-oom": "1"}}, "--models-max", "0") as router:
        await router.ctx.scheduler.load("idle")
        await router.wait_for_status("idle", Status.LOADED)
        with router.ctx.scheduler.subscribe() as events:
            with pytest.raises(ModelUnavailable) as caught:
                async with router.ctx.scheduler.lease("big"):
                    pass
            loads = [
                e for e in drain(events) if e["event"] == "model_status" and e["model"] == "big"
            ]
        assert "out of memory" in caught.value.failure.message
        assert len(loads) == 2  # the first try, and one more after the eviction
        snap = router.snapshot
        assert snap.models["idle"].status is Status.UNLOADED
        assert snap.models["idle"].last_eviction == "memory for big"


async def test_requests_that_give_up_waiting_leave_nothing_behind_in_the_scheduler(
    fake_router: RouterFactory,
) -> None:
    async with fake_router({"a": {"fake-load-time": "30"}}) as router:
        scheduler = router.ctx.scheduler

        async def wait_briefly() -> None:
            with trio.move_on_after(0.2):
                async with scheduler.lease("a"):
                    raise AssertionError("a is still loading")

        async with trio.open_nursery() as nursery:
            for _ in range(50):
                nursery.start_soon(wait_briefly)
        await scheduler.unload("a")  # a round trip: every release before it was handled
        assert len(scheduler._replies) == 0  # every abandoned wait's reply channel is gone
        assert router.snapshot.models["a"].in_flight == 0


async def test_a_busy_model_never_holds_another_models_load_back(
    fake_router: RouterFactory,
) -> None:
    """CPU placement: b starts at once, beside a busy a that had every core; a is started
    again on a lane of its own only once its request ends."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: every lane is shared")
    async with fake_router({"a": {}, "b": {}}) as router:
        scheduler = router.ctx.scheduler
        async with scheduler.lease("a") as busy:
            first = router.snapshot.models["a"].pid
            with trio.fail_after(30):  # would hang if b waited for a's request to end
                async with scheduler.lease("b") as other:
                    assert other.port == router.snapshot.models["b"].port
            a = router.snapshot.models["a"]
            assert (a.pid, a.port, a.draining_for) == (first, busy.port, "b")
        with trio.fail_after(30):
            snap = await scheduler.wait_until(
                lambda s: (
                    s.models["a"].status is Status.LOADED
                    and not s.models["a"].stopping
                    and s.models["a"].pid not in (0, first)
                )
            )
        a_cpus, b_cpus = snap.models["a"].cpu, snap.models["b"].cpu
        assert a_cpus is not None
        assert b_cpus is not None
        assert set(a_cpus.cpus).isdisjoint(b_cpus.cpus)
