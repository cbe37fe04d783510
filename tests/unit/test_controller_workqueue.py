"""The work queue: one run per burst of adds, never two workers on one key, deadlines as
timers, failures retried with backoff."""

from __future__ import annotations

import asyncio

from controller.engine.workqueue import WorkQueue

DEADLINE_S = 5.0


async def test_a_burst_of_adds_is_one_run_and_an_add_while_busy_runs_again() -> None:
    queue: WorkQueue[str] = WorkQueue()
    runs: list[str] = []
    first_started, release, second_done = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def handle(key: str) -> None:
        runs.append(key)
        if len(runs) == 1:
            first_started.set()
            await release.wait()
        else:
            second_done.set()

    for _ in range(5):
        queue.add("a")
    workers = [asyncio.create_task(queue.work(handle)) for _ in range(4)]
    await asyncio.wait_for(first_started.wait(), DEADLINE_S)
    queue.add("a")  # while a worker holds it: not a second concurrent run, but one more after
    queue.add("a")
    assert len(queue) == 0, "not waiting where an idle worker could take it"
    assert runs == ["a"]
    release.set()
    await asyncio.wait_for(second_done.wait(), DEADLINE_S)
    assert runs == ["a", "a"]
    for worker in workers:
        worker.cancel()
    await asyncio.gather(*workers, return_exceptions=True)


async def test_the_earliest_deadline_wins_and_a_failure_is_retried() -> None:
    queue: WorkQueue[str] = WorkQueue()
    loop = asyncio.get_running_loop()
    started = loop.time()
    seen: list[tuple[str, float]] = []
    done = asyncio.Event()

    async def handle(key: str) -> None:
        seen.append((key, loop.time() - started))
        if len(seen) == 1:
            raise RuntimeError("the API server said no")
        done.set()

    queue.add_after("b", 60.0)
    queue.add_after("b", 0.05)  # earlier: replaces the 60 s timer
    queue.add_after("b", 30.0)  # later: ignored
    worker = asyncio.create_task(queue.work(handle))
    await asyncio.wait_for(done.wait(), DEADLINE_S)
    assert [key for key, _ in seen] == ["b", "b"], "one run at the deadline, one retry"
    assert seen[1][1] - seen[0][1] >= 0.4, "the retry waited for its backoff"
    worker.cancel()
    await asyncio.gather(worker, return_exceptions=True)
    queue.close()
