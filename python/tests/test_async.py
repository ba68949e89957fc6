"""The async client against the real server: the same calls as the blocking one, the same answers and errors."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC
from typing import Any

import pytest

import trainyard
from conftest import Server
from helpers import task_doc, unique


def test_submit_get_list_and_follow_to_the_end(server: Server) -> None:
    async def go() -> None:
        async with trainyard.AsyncClient(server.url, server.token) as c:
            prefix = unique("async")
            cmd = "for i in 1 2 3; do echo {} $i; sleep 0.2; done"
            tasks = [await c.submit(task_doc(f"{prefix}-{k}", cmd.format(k))) for k in ("a", "b")]
            assert all(t.status is trainyard.Status.QUEUED and t.created_at.tzinfo is UTC for t in tasks)

            # Both logs followed at once, straight after the submit: each waits for its task to start and
            # ends with its replica.
            async def follow(task: trainyard.Task) -> list[trainyard.LogLine]:
                return [line async for line in c.logs(task.name, follow=True, poll=0.2)]

            seen = await asyncio.gather(*(follow(t) for t in tasks))
            for k, lines in zip(("a", "b"), seen, strict=True):
                assert [x.text for x in lines] == [f"{k} {i}" for i in (1, 2, 3)]
                assert all(x.time is not None and x.time.tzinfo is UTC for x in lines)

            done = [await c.wait(t, timeout=30, poll=0.2) for t in tasks]
            assert [t.status for t in done] == [trainyard.Status.SUCCEEDED] * 2
            got = await c.get(tasks[0].name)
            assert got.id == tasks[0].id and got.spec is not None
            assert got.run_started_at is not None and got.created_at <= got.run_started_at <= got.status_since

            page = await c.list(search=prefix, sort="oldest")
            assert [t.id for t in page] == [t.id for t in tasks] and page.next_cursor is None
            oldest_first = [t.id async for t in c.iter_tasks(search=prefix, sort="oldest", page_size=1)]
            assert oldest_first == [t.id for t in tasks]
            assert len(await c.list_all(search=prefix)) == 2
            assert [str(x) for x in [x async for x in c.logs(tasks[1], tail=1)]] == ["b 3"]
            events = await c.events(tasks[0])
            assert events[-1].reason == "Completed" and all(e.at.tzinfo is UTC for e in events)
            assert (await c.whoami()).name == "admin"

    asyncio.run(go())


def _refusal(call: Callable[[], object]) -> trainyard.TrainyardError:
    try:
        call()
    except trainyard.TrainyardError as e:
        return e
    raise AssertionError("no error raised")


async def _async_refusal(call: Callable[[], Awaitable[Any]]) -> trainyard.TrainyardError:
    try:
        await call()
    except trainyard.TrainyardError as e:
        return e
    raise AssertionError("no error raised")


def test_errors_are_the_blocking_clients(client: trainyard.Client, server: Server) -> None:
    done = client.wait(client.submit(task_doc(unique("ended"), "echo hi")), timeout=30, poll=0.2)

    async def go() -> list[tuple[trainyard.TrainyardError, trainyard.TrainyardError]]:
        pairs = []
        async with trainyard.AsyncClient(server.url, server.token) as c:
            for sync_call, async_call in [
                (lambda: client.get("no-such-task-zz9"), lambda: c.get("no-such-task-zz9")),
                (lambda: client.submit("a: [\n"), lambda: c.submit("a: [\n")),
                (lambda: client.stop(done), lambda: c.stop(done)),
                (lambda: client.list(cursor="not-a-cursor"), lambda: c.list(cursor="not-a-cursor")),
            ]:
                pairs.append((_refusal(sync_call), await _async_refusal(async_call)))
            with pytest.raises(trainyard.NotFound):
                [x async for x in c.logs("no-such-task-zz9")]  # looked up as it is iterated
            with pytest.raises(ValueError):
                c.logs(done, tail=-1)  # checked at once
        async with trainyard.AsyncClient(server.url, "ty_not_a_real_token") as bad:
            with trainyard.Client(server.url, "ty_not_a_real_token") as bad_sync:
                pairs.append((_refusal(bad_sync.whoami), await _async_refusal(bad.whoami)))
        async with trainyard.AsyncClient("http://127.0.0.1:9", "ty_x", timeout=5) as gone:
            with trainyard.Client("http://127.0.0.1:9", "ty_x", timeout=5) as gone_sync:
                pairs.append((_refusal(gone_sync.list), await _async_refusal(gone.list)))
        return pairs

    pairs = asyncio.run(go())
    kinds = [type(a) for a, _ in pairs]
    assert kinds == [
        trainyard.NotFound,
        trainyard.ValidationError,
        trainyard.Conflict,
        trainyard.BadRequest,
        trainyard.Unauthorized,
        trainyard.TrainyardConnectionError,
    ]
    for blocking, awaited in pairs:
        assert type(awaited) is type(blocking)
        if isinstance(blocking, trainyard.ProblemError):
            # The same refusal, word for word (a connection error's words are the HTTP library's, which differ).
            assert isinstance(awaited, trainyard.ProblemError) and str(awaited) == str(blocking)
            assert awaited.status == blocking.status and awaited.problems == blocking.problems


def test_wait_gives_up_alike(server: Server) -> None:
    async def go() -> None:
        async with trainyard.AsyncClient(server.url, server.token) as c:
            task = await c.submit(task_doc(unique("asleep"), "sleep 60"))
            try:
                await c.wait(task, until="running", timeout=30, poll=0.2)
                with pytest.raises(trainyard.WaitTimeout) as timed_out:
                    await c.wait(task, timeout=0.5, poll=0.2)
                assert timed_out.value.task.status is trainyard.Status.RUNNING
            finally:
                await c.stop(task)
            assert (await c.wait(task, timeout=30, poll=0.2)).status is trainyard.Status.STOPPED

    asyncio.run(go())
