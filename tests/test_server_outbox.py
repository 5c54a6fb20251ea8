"""The engine thread's events reach the asyncio side in order, a step's together in one wake-up of the loop, and a
request handle reports a client that went away after the events that came before it."""

import asyncio
import threading

import pytest

from specdec.server.handle import ClientGone, RequestHandle
from specdec.server.outbox import Outbox


class _CountingLoop:
    """Stands in for an event loop: records each call_soon_threadsafe (one wake-up each) and runs it at once."""

    def __init__(self):
        self.wakeups = 0
        self.closed = False

    def call_soon_threadsafe(self, callback, *args):
        if self.closed:
            raise RuntimeError("Event loop is closed")
        self.wakeups += 1
        callback(*args)


def test_a_held_steps_events_arrive_in_order_with_one_wakeup_per_loop():
    outbox, first, second, got = Outbox(), _CountingLoop(), _CountingLoop(), []
    with outbox.holding():
        for i in range(5):
            outbox.hand(first if i % 2 else second, got.append, i)
        assert got == []  # nothing leaves before the step has handed everything
    assert [x for x in got if x % 2] == [1, 3] and [x for x in got if not x % 2] == [0, 2, 4]
    assert (first.wakeups, second.wakeups) == (1, 1)
    outbox.hand(first, got.append, 5)  # outside a step: at once
    assert got[-1] == 5 and first.wakeups == 2


def test_other_threads_hand_over_at_once_while_the_engine_thread_holds():
    outbox, loop, got = Outbox(), _CountingLoop(), []
    with outbox.holding():
        thread = threading.Thread(target=outbox.hand, args=(loop, got.append, "cancelled"))
        thread.start()
        thread.join()
        assert got == ["cancelled"]
        outbox.hand(loop, got.append, "delta")
        assert got == ["cancelled"]
    assert got == ["cancelled", "delta"]


def test_a_closed_loop_takes_nothing_and_raises_nothing():
    outbox, loop = Outbox(), _CountingLoop()
    loop.closed = True
    outbox.hand(loop, pytest.fail, "never")
    with outbox.holding():
        outbox.hand(loop, pytest.fail, "never")


def test_a_step_that_fails_still_hands_over_what_it_held():
    outbox, loop, got = Outbox(), _CountingLoop(), []
    with pytest.raises(ValueError):
        with outbox.holding():
            outbox.hand(loop, got.append, "before the failure")
            raise ValueError
    assert got == ["before the failure"]


class _Worker:
    def __init__(self):
        self.outbox, self.jobs, self.cancelled = Outbox(), [], []

    def submit(self, job):
        self.jobs.append(job)

    def cancel(self, request_id):
        self.cancelled.append(request_id)


def test_a_handle_gives_the_events_before_a_disconnect_then_client_gone():
    async def scenario():
        disconnect = asyncio.Event()

        async def receive():
            await disconnect.wait()
            return {"type": "http.disconnect"}

        worker = _Worker()
        handle = RequestHandle(worker, receive, lambda status, h: None, arrived=0.0)
        handle.submit([object()])
        waiting = asyncio.ensure_future(handle.next())
        await asyncio.sleep(0)
        worker.jobs[0].emit("first")  # from this thread: a real worker's thread hands over the same way
        assert await waiting == (0, "first")
        worker.jobs[0].emit("second")
        disconnect.set()
        await asyncio.sleep(0.01)
        assert await handle.next() == (0, "second")
        for _ in range(2):  # gone stays gone
            with pytest.raises(ClientGone):
                await handle.next()
        handle.close()
        assert worker.cancelled == handle.ids

    asyncio.run(asyncio.wait_for(scenario(), 5))
