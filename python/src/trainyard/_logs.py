"""Replicas' logs as plans (see ``_plan``): the attempts and replicas a task had, a log read whole or from its
tail, and followed through the server's event stream."""

from __future__ import annotations

from dataclasses import dataclass, field

from . import _sse
from ._plan import Call, Emit, Follow, Items, Plan, build, get_json, send, sleep
from ._tasks import TaskRef, get_by_id, resolve, task_path
from .errors import PROBLEM_TYPE_PREFIX, NotFound
from .models import AttemptReplicas, LogLine


def replicas(task: TaskRef) -> Plan[list[AttemptReplicas]]:
    return (yield from _attempts((yield from resolve(task))))


def _attempts(task_id: str) -> Plan[list[AttemptReplicas]]:
    data = yield from get_json(task_path(task_id) + "/logs")
    return build(lambda d: [AttemptReplicas.from_json(a) for a in d["items"]], data)


def check(tail: int | None, poll: float) -> None:
    """What a log read is asked, checked when it is asked (the read itself waits for the first item)."""
    if tail is not None and tail < 0:
        raise ValueError("tail must be 0 or more")
    if poll <= 0:
        raise ValueError("poll must be positive")


def lines_of(
    task: TaskRef, replica: str | None, attempt: int | None, tail: int | None, follow: bool, poll: float
) -> Items[LogLine]:
    """:func:`lines`, the task looked up first."""
    task_id = yield from resolve(task)
    yield from lines(task_id, replica, attempt, tail, follow, poll)


def lines(
    task_id: str, replica: str | None, attempt: int | None, tail: int | None, follow: bool, poll: float
) -> Items[LogLine]:
    """A replica's log: what is there now (or its last ``tail`` lines), then with ``follow`` the event stream
    until the replica ends."""
    chosen = yield from _pick_attempt(task_id, attempt, follow, poll)
    if chosen is None:
        return
    name = _pick_replica(chosen, replica)
    shown, at = yield from read_now(task_id, name, chosen.attempt, follow)
    if tail is not None:
        shown = shown[max(0, len(shown) - tail) :] if tail else []
    for line in shown:
        yield Emit(line)
    if follow:
        yield stream(task_id, name, chosen.attempt, at)


def read_now(task_id: str, name: str, attempt: int, follow: bool) -> Plan[tuple[list[LogLine], int]]:
    """A replica's log as it is now, in as many reads as it takes, and the offset a stream goes on from. A
    line still being written is left to the stream when the log is to be followed (so that it comes whole),
    else it is the last line."""
    path = task_path(task_id) + "/logs"
    params: dict[str, str | int] = {"replica": name, "attempt": attempt}
    data = bytearray()
    at = 0
    while True:
        resp = yield from send("GET", path, params={**params, "offset": at})
        try:
            nxt = int(resp.headers.get("x-next-offset", "0"))
        except ValueError:
            nxt = 0
        if not resp.content or nxt <= at:
            break
        data += resp.content
        at = nxt
    raw_lines = data.split(b"\n")
    partial = raw_lines.pop()  # after the last newline: a line still being written, or nothing
    if follow and partial:
        at -= len(partial)
    elif partial:
        raw_lines.append(partial)
    lines = [
        LogLine.parse(raw.decode("utf-8", errors="replace").removesuffix("\r"), replica=name, attempt=attempt)
        for raw in raw_lines
    ]
    return lines, at


def stream(task_id: str, name: str, attempt: int, at: int) -> Follow[LogLine]:
    """A replica's log followed from offset ``at`` until the replica ends."""
    params: dict[str, str | int] = {"replica": name, "attempt": attempt, "offset": at, "follow": "true"}
    call = Call("GET", task_path(task_id) + "/logs", params=params, headers={"Accept": "text/event-stream"})
    return Follow(call, _LogStream(name, attempt), what=f"the log stream of {name}")


@dataclass(slots=True)
class _LogStream:
    """A followed log's event stream: one line per ``message`` event, until the ``end`` event."""

    replica: str
    attempt: int
    done: bool = False
    _lines: _sse.LineSplitter = field(default_factory=_sse.LineSplitter)
    _events: _sse.EventReader = field(default_factory=_sse.EventReader)

    def feed(self, chunk: bytes) -> list[LogLine]:
        out: list[LogLine] = []
        for line in self._lines.feed(chunk):
            ev = self._events.feed(line)
            if ev is None or ev.event not in ("message", "end"):
                continue
            if ev.event == "end":
                self.done = True
                break
            # The server sends one log line per event, so the line breaks left inside one (a data field each)
            # were carriage returns in the line (a progress bar's).
            out.append(LogLine.parse("\r".join(ev.data), replica=self.replica, attempt=self.attempt))
        return out


def _pick_attempt(task_id: str, attempt: int | None, wait_for_it: bool, poll: float) -> Plan[AttemptReplicas | None]:
    while True:
        attempts = yield from _attempts(task_id)
        if attempt is None:
            if attempts:
                return attempts[0]
        else:
            for a in attempts:
                if a.attempt == attempt:
                    return a
        current = yield from get_by_id(task_id)
        if attempt is not None and (attempt < current.attempt or current.is_terminal):
            have = ", ".join(str(a.attempt) for a in attempts) or "none"
            raise NotFound(
                status=404,
                type=PROBLEM_TYPE_PREFIX + "not-found",
                title="Not found",
                detail=f"task {current.name} has no replicas in attempt {attempt} (attempts with logs: {have})",
            )
        if not wait_for_it or current.is_terminal:
            return None
        yield from sleep(poll)


def _pick_replica(chosen: AttemptReplicas, replica: str | None) -> str:
    names = [r.name for r in chosen.replicas]
    if not names:
        raise NotFound(
            status=404,
            type=PROBLEM_TYPE_PREFIX + "not-found",
            title="Not found",
            detail=f"attempt {chosen.attempt} has no replicas",
        )
    if replica is None:
        return names[0]
    found = [n for n in names if n == replica or n.endswith("-" + replica)]
    if len(found) == 1:
        return found[0]
    if not found:
        raise NotFound(
            status=404,
            type=PROBLEM_TYPE_PREFIX + "not-found",
            title="Not found",
            detail=f"attempt {chosen.attempt} has no replica {replica!r}; it has {', '.join(names)}",
        )
    raise ValueError(f"replica {replica!r} could be any of {', '.join(found)}; name one")
