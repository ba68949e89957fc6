"""The connection to a server: an HTTP session with the token, blocking or async, that runs the operations'
plans (see ``_plan``). Each does only the I/O: a call sent and its response handed back, a sleep, work on
this machine, streams read as they arrive; what is asked and what the answers mean is the plans'."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator
from typing import Any, TypeVar

import httpx

from ._plan import (
    Blocking,
    Call,
    Emit,
    Follow,
    Items,
    Merge,
    Plan,
    Sleep,
    Step,
    Streaming,
    problem,
    stream_broke,
    stream_timeout,
    unreachable,
)

__version__ = "0.1.0"

DEFAULT_SERVER = "http://127.0.0.1:8080"

_R = TypeVar("_R")
_T = TypeVar("_T")


def _headers(token: str | None) -> dict[str, str]:
    headers = {"User-Agent": f"trainyard-python/{__version__}", "Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    return headers


class _Connection:
    """A blocking session: what :class:`~trainyard.Client`'s calls go through."""

    def __init__(
        self,
        url: str = DEFAULT_SERVER,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        verify: bool | str = True,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        """``url``: the server (``http://host:8080``); ``token``: an API token (``ty_...``); ``timeout``:
        seconds any one request may take (a followed log waits as long as the replica runs); ``verify``:
        TLS verification (``False``, or a CA bundle's path); ``transport``: an httpx transport to send the
        requests through instead of the network (``httpx.MockTransport`` in a test)."""
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._http = httpx.Client(
            base_url=self.url, headers=_headers(token), timeout=timeout, verify=verify, transport=transport
        )

    def close(self) -> None:
        """Closes the connections; the client cannot be used after."""
        self._http.close()

    def _run(self, plan: Plan[_R]) -> _R:
        answer: Any = None
        while True:
            try:
                step = plan.send(answer)
            except StopIteration as done:
                result: _R = done.value
                return result
            answer = self._do(step)

    def _items(self, plan: Streaming[_T, _R]) -> Generator[_T, None, _R]:
        answer: Any = None
        while True:
            try:
                step = plan.send(answer)
            except StopIteration as done:
                result: _R = done.value
                return result
            answer = None
            if isinstance(step, Emit):
                yield step.item
            elif isinstance(step, Follow):
                yield from self._follow(step)
            elif isinstance(step, Merge):
                yield from self._merge(step)
            else:
                answer = self._do(step)

    def _iterate(self, items: Items[_T]) -> Iterator[_T]:
        yield from self._items(items)

    def _run_streaming(self, plan: Streaming[_T, _R], on_item: Callable[[_T], object]) -> _R:
        """Runs a plan that hands out items as it goes, each to ``on_item``; returns its result."""
        items = self._items(plan)
        while True:
            try:
                item = next(items)
            except StopIteration as done:
                result: _R = done.value
                return result
            on_item(item)

    def _do(self, step: Step) -> Any:
        if isinstance(step, Sleep):
            time.sleep(step.seconds)
            return None
        if isinstance(step, Blocking):
            return step.work()
        try:
            return self._http.request(
                step.method, step.path, params=step.params, content=step.content, headers=step.headers
            )
        except httpx.TransportError as e:
            raise unreachable(e, step, self.url, self.timeout) from e

    def _follow(self, follow: Follow[_T]) -> Iterator[_T]:
        call: Call = follow.call
        timeout = stream_timeout(self.timeout)
        try:
            with self._http.stream(
                call.method, call.path, params=call.params, headers=call.headers, timeout=timeout
            ) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    raise problem(resp)
                for chunk in resp.iter_bytes():
                    yield from follow.reader.feed(chunk)
                    if follow.reader.done:
                        return
        except httpx.TransportError as e:
            raise stream_broke(e, follow, timeout, self.url) from e

    def _merge(self, merge: Merge[_T]) -> Iterator[_T]:
        """Each stream read on a thread of its own, their items handed out here as they come. Leaving early
        (or one stream failing) tells the others to stop; each does at its next chunk (a keep-alive at the
        latest), its thread a daemon meanwhile."""
        if len(merge.follows) == 1:
            yield from self._follow(merge.follows[0])
            return
        found: queue.Queue[tuple[str, Any]] = queue.Queue()
        leave = threading.Event()

        def pump(follow: Follow[_T]) -> None:
            try:
                for item in self._follow(follow):
                    if leave.is_set():
                        return
                    found.put(("item", item))
            except BaseException as e:  # handed to the reader, who raises it
                found.put(("error", e))
                return
            found.put(("done", None))

        threads = [threading.Thread(target=pump, args=(f,), daemon=True) for f in merge.follows]
        for t in threads:
            t.start()
        running = len(threads)
        try:
            while running:
                what, value = found.get()
                if what == "item":
                    yield value
                elif what == "done":
                    running -= 1
                else:
                    raise value
        finally:
            leave.set()


class _AsyncConnection:
    """An async session: what :class:`~trainyard.AsyncClient`'s calls go through."""

    def __init__(
        self,
        url: str = DEFAULT_SERVER,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        verify: bool | str = True,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        """As :class:`~trainyard.Client`'s; ``transport`` is an async one (``httpx.MockTransport`` serves
        both)."""
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._http = httpx.AsyncClient(
            base_url=self.url, headers=_headers(token), timeout=timeout, verify=verify, transport=transport
        )

    async def close(self) -> None:
        """Closes the connections; the client cannot be used after."""
        await self._http.aclose()

    async def _run(self, plan: Plan[_R]) -> _R:
        answer: Any = None
        while True:
            try:
                step = plan.send(answer)
            except StopIteration as done:
                result: _R = done.value
                return result
            answer = await self._do(step)

    async def _iterate(self, items: Items[_T]) -> AsyncGenerator[_T, None]:
        answer: Any = None
        while True:
            try:
                step = items.send(answer)
            except StopIteration:
                return
            answer = None
            if isinstance(step, Emit):
                yield step.item
            elif isinstance(step, Follow):
                async for item in self._follow(step):
                    yield item
            elif isinstance(step, Merge):
                async for item in self._merge(step):
                    yield item
            else:
                answer = await self._do(step)

    async def _run_streaming(self, plan: Streaming[_T, _R], on_item: Callable[[_T], object]) -> _R:
        """Runs a plan that hands out items as it goes, each to ``on_item`` (awaited when it returns an
        awaitable); returns its result."""

        async def hand(item: _T) -> None:
            out = on_item(item)
            if asyncio.iscoroutine(out) or isinstance(out, asyncio.Future):
                await out

        answer: Any = None
        while True:
            try:
                step = plan.send(answer)
            except StopIteration as done:
                result: _R = done.value
                return result
            answer = None
            if isinstance(step, Emit):
                await hand(step.item)
            elif isinstance(step, Follow):
                async for item in self._follow(step):
                    await hand(item)
            elif isinstance(step, Merge):
                async for item in self._merge(step):
                    await hand(item)
            else:
                answer = await self._do(step)

    async def _do(self, step: Step) -> Any:
        if isinstance(step, Sleep):
            await asyncio.sleep(step.seconds)
            return None
        if isinstance(step, Blocking):
            return await asyncio.to_thread(step.work)
        try:
            return await self._http.request(
                step.method, step.path, params=step.params, content=step.content, headers=step.headers
            )
        except httpx.TransportError as e:
            raise unreachable(e, step, self.url, self.timeout) from e

    async def _follow(self, follow: Follow[_T]) -> AsyncIterator[_T]:
        call: Call = follow.call
        timeout = stream_timeout(self.timeout)
        try:
            async with self._http.stream(
                call.method, call.path, params=call.params, headers=call.headers, timeout=timeout
            ) as resp:
                if resp.status_code >= 400:
                    await resp.aread()
                    raise problem(resp)
                async for chunk in resp.aiter_bytes():
                    for item in follow.reader.feed(chunk):
                        yield item
                    if follow.reader.done:
                        return
        except httpx.TransportError as e:
            raise stream_broke(e, follow, timeout, self.url) from e

    async def _merge(self, merge: Merge[_T]) -> AsyncIterator[_T]:
        """Each stream read by a task of its own, their items handed out here as they come; leaving early (or
        one stream failing) cancels the others."""
        found: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        async def pump(follow: Follow[_T]) -> None:
            try:
                async for item in self._follow(follow):
                    await found.put(("item", item))
            except Exception as e:  # handed to the reader, who raises it
                await found.put(("error", e))
                return
            await found.put(("done", None))

        tasks = [asyncio.create_task(pump(f)) for f in merge.follows]
        running = len(tasks)
        try:
            while running:
                what, value = await found.get()
                if what == "item":
                    yield value
                elif what == "done":
                    running -= 1
                else:
                    raise value
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
