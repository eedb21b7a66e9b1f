"""The event bus behind /models/sse: a slow subscriber is dropped, never waited for."""

from __future__ import annotations

import trio
import trio.testing

from troupe.actors.events import EventBus


async def test_a_slow_subscriber_is_dropped_and_others_still_get_events() -> None:
    bus = EventBus(buffer=2)
    with bus.subscribe() as slow, bus.subscribe() as fast:
        got = []
        for i in range(5):
            bus.publish({"n": i})  # never blocks, even with a full subscriber
            got.append(fast.receive_nowait())
        assert [e["n"] for e in got] == [0, 1, 2, 3, 4]
        assert bus.subscriber_count == 1
        assert [e["n"] async for e in slow] == [0, 1]  # then its stream ends


async def test_close_ends_every_stream_and_late_subscribers_get_nothing() -> None:
    bus = EventBus()
    with bus.subscribe() as events:
        bus.publish({"a": 1})
        bus.close()
        assert [e async for e in events] == [{"a": 1}]
    with bus.subscribe() as late:
        with trio.fail_after(1):
            assert [e async for e in late] == []


async def test_wait_for_subscribers_returns_once_enough_have_joined() -> None:
    bus = EventBus()
    done = trio.Event()

    async def waiter() -> None:
        await bus.wait_for_subscribers(2)
        done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        with bus.subscribe():
            await trio.testing.wait_all_tasks_blocked()
            assert not done.is_set()
            with bus.subscribe():
                with trio.fail_after(1):
                    await done.wait()
