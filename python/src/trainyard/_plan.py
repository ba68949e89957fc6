"""What an operation does, apart from doing it: the client's calls as plans, with no I/O of their own.

A plan is a generator that yields the steps it needs done (a :class:`Call`, a :class:`Sleep`) and is sent each
one's result back (the answer, or ``None``); what it returns is the operation's result. Work done on this
machine that may take a while (hashing a working directory's files) is a :class:`Blocking` step, so that the
async client runs it off its event loop. A plan that hands out items as it goes (a list read page by page, a
log) also yields :class:`Emit`, :class:`Follow` and :class:`Merge`. The sync and the
async client each run plans over their own HTTP session (``_transport``), so that how a request is made, how its
answer is read and which error a refusal is, is written once, here and in the operations' modules.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeAlias, TypeVar

import httpx

from .errors import ProblemError, TrainyardConnectionError, UnexpectedResponse

_R = TypeVar("_R")
_T = TypeVar("_T")
_T_co = TypeVar("_T_co", covariant=True)

# A followed stream sends a keep-alive every 15 s; a read that waits longer than this means it is gone.
STREAM_READ_TIMEOUT = 60.0


@dataclass(frozen=True, slots=True)
class Call:
    """One request, answered with its response (whatever its status: the plan reads it)."""

    method: str
    path: str
    params: Mapping[str, str | int] | None = None
    content: bytes | None = None
    headers: Mapping[str, str] | None = None


@dataclass(frozen=True, slots=True)
class Sleep:
    """A pause, answered with ``None``."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Blocking(Generic[_R]):
    """Work on this machine (reading and hashing files), answered with what ``work()`` returns (what it raises
    ends the operation). The sync client runs it in place, the async one in a worker thread."""

    work: Callable[[], _R]


@dataclass(frozen=True, slots=True)
class Emit(Generic[_T]):
    """An item for whoever iterates the plan, answered with ``None`` once it is taken."""

    item: _T


class StreamReader(Protocol[_T_co]):
    """What a followed stream's bytes are, fed as they arrive."""

    def feed(self, chunk: bytes) -> Sequence[_T_co]:
        """The items this chunk completes."""
        ...

    @property
    def done(self) -> bool:
        """The stream said it has ended: nothing more is read from it."""
        ...


@dataclass(frozen=True, slots=True)
class Follow(Generic[_T]):
    """A streamed request: its items emitted as ``reader`` finds them, until the stream or the reader ends;
    answered with ``None``. ``what`` names the stream in errors (``the log stream of ...``)."""

    call: Call
    reader: StreamReader[_T]
    what: str


@dataclass(frozen=True, slots=True)
class Merge(Generic[_T]):
    """Several streamed requests followed at once (every replica of an attempt), their items emitted as they
    come from any of them, until each has ended; answered with ``None``. The first that fails ends them all."""

    follows: Sequence[Follow[_T]]


Step: TypeAlias = Call | Sleep | Blocking[Any]
Plan: TypeAlias = Generator[Step, Any, _R]
"""An operation that returns an ``_R``."""
Items: TypeAlias = Generator[Step | Emit[_T] | Follow[_T] | Merge[_T], Any, None]
"""An operation that hands out ``_T`` items as it goes."""
Streaming: TypeAlias = Generator[Step | Emit[_T] | Follow[_T] | Merge[_T], Any, _R]
"""An operation that hands out ``_T`` items as it goes and then returns an ``_R``."""


# --- steps ------------------------------------------------------------------------------------------------


def send(
    method: str,
    path: str,
    *,
    params: Mapping[str, str | int] | None = None,
    content: bytes | None = None,
    headers: Mapping[str, str] | None = None,
) -> Plan[httpx.Response]:
    """The answer to one request; a refusal (4xx, 5xx) raises as its :class:`ProblemError`."""
    resp = yield Call(method, path, params=params, content=content, headers=headers)
    if not isinstance(resp, httpx.Response):
        raise TypeError(f"a call was answered with {type(resp).__name__}, not a response")
    if resp.status_code >= 400:
        raise problem(resp)
    return resp


def get_json(path: str, params: Mapping[str, str | int] | None = None) -> Plan[Any]:
    """A GET's JSON."""
    return json_of((yield from send("GET", path, params=params)))


def sleep(seconds: float) -> Plan[None]:
    yield Sleep(seconds)


def blocking(work: Callable[[], _R]) -> Plan[_R]:
    """What ``work()`` returns, run as a :class:`Blocking` step."""
    result: _R = yield Blocking(work)
    return result


# --- answers ----------------------------------------------------------------------------------------------


def problem(resp: httpx.Response) -> ProblemError:
    """The error for an answer with an error status (its body read)."""
    return ProblemError.from_response(
        resp.status_code, resp.text, method=resp.request.method, url=str(resp.request.url)
    )


def json_of(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError as e:
        raise UnexpectedResponse(
            f"{resp.request.method} {resp.request.url} answered {resp.status_code} with a body that is not JSON"
        ) from e


def build(make: Callable[[Any], _R], data: Any) -> _R:
    """``make(data)``, an answer whose shape is not the documented one being an UnexpectedResponse."""
    try:
        return make(data)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, OverflowError) as e:
        raise UnexpectedResponse(f"the server's answer does not have the expected shape ({e!r}): {data!r:.500}") from e


# --- transport failures -----------------------------------------------------------------------------------


def unreachable(e: httpx.TransportError, call: Call, url: str, timeout: float) -> TrainyardConnectionError:
    """The error for a request that got no answer."""
    if isinstance(e, httpx.TimeoutException):
        return TrainyardConnectionError(f"{call.method} {url}{call.path}: no answer within {timeout} s ({e})", url=url)
    return TrainyardConnectionError(f"cannot reach {url}: {e} (is `trainyard up` running?)", url=url)


def stream_timeout(timeout: float) -> httpx.Timeout:
    """A followed stream's timeouts: a read may wait for keep-alives, however short the client's timeout."""
    return httpx.Timeout(timeout, read=max(STREAM_READ_TIMEOUT, timeout))


def stream_broke(
    e: httpx.TransportError, follow: Follow[Any], timeout: httpx.Timeout, url: str
) -> TrainyardConnectionError:
    """The error for a followed stream that broke or went quiet."""
    if isinstance(e, httpx.TimeoutException):
        return TrainyardConnectionError(f"{follow.what} went quiet for over {timeout.read} s ({e})", url=url)
    return TrainyardConnectionError(f"{follow.what} broke: {e}", url=url)
