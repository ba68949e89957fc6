"""The connection to a server: an HTTP session with the token, blocking or async, that runs the operations'
plans (see ``_plan``). Each does only the I/O: a call sent and its response handed back, a sleep, a stream
read as it arrives; what is asked and what the answers mean is the plans'."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from typing import Any, TypeVar

import httpx

from ._plan import Call, Emit, Follow, Items, Plan, Sleep, Step, problem, stream_broke, stream_timeout, unreachable

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

    def _iterate(self, items: Items[_T]) -> Iterator[_T]:
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
                yield from self._follow(step)
            else:
                answer = self._do(step)

    def _do(self, step: Step) -> httpx.Response | None:
        if isinstance(step, Sleep):
            time.sleep(step.seconds)
            return None
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
            else:
                answer = await self._do(step)

    async def _do(self, step: Step) -> httpx.Response | None:
        if isinstance(step, Sleep):
            await asyncio.sleep(step.seconds)
            return None
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
