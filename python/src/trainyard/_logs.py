"""Replicas' logs: the attempts and replicas a task had, a log read whole or from its tail, and followed
through the server's event stream."""

from __future__ import annotations

import builtins
import time
from collections.abc import Iterator, Mapping

import httpx

from . import _sse
from ._tasks import TaskRef, _task_path, _Tasks
from ._transport import _build
from .errors import PROBLEM_TYPE_PREFIX, NotFound, ProblemError, TrainyardConnectionError
from .models import AttemptReplicas, LogLine

# A followed log stream sends a keep-alive every 15 s; a read that waits longer than this means it is gone.
_STREAM_READ_TIMEOUT = 60.0


class _Logs(_Tasks):
    """The log reading of the :class:`~trainyard.Client`."""

    def replicas(self, task: TaskRef) -> builtins.list[AttemptReplicas]:
        """The replicas each attempt had, newest attempt first (empty before the first one starts)."""
        data = self._get(_task_path(self.resolve(task)) + "/logs")
        return _build(lambda d: [AttemptReplicas.from_json(a) for a in d["items"]], data)

    def logs(
        self,
        task: TaskRef,
        *,
        replica: str | None = None,
        attempt: int | None = None,
        tail: int | None = None,
        follow: bool = False,
        poll: float = 0.5,
    ) -> Iterator[LogLine]:
        """A replica's log, line by line: the first replica's (the master's or the head's) unless ``replica``
        (its full name, or its end such as ``worker-0``), of the latest attempt unless ``attempt``, whole or
        its last ``tail`` lines. With ``follow`` it goes on as the replica writes (the server's event stream)
        and ends when the replica ends; a task that has not started yet is waited for (every ``poll``
        seconds). Without ``follow``, a task with no replicas yet has no lines.

        The task is looked up at once (a :class:`~trainyard.errors.NotFound` is raised here); the log is
        read as the iterator is."""
        if tail is not None and tail < 0:
            raise ValueError("tail must be 0 or more")
        task_id = self.resolve(task)
        return self._log_lines(task_id, replica, attempt, tail, follow, poll)

    def _log_lines(
        self,
        task_id: str,
        replica: str | None,
        attempt: int | None,
        tail: int | None,
        follow: bool,
        poll: float,
    ) -> Iterator[LogLine]:
        chosen = self._pick_attempt(task_id, attempt, follow, poll)
        if chosen is None:
            return
        name = _pick_replica(chosen, replica)
        path = _task_path(task_id) + "/logs"
        params: dict[str, str | int] = {"replica": name, "attempt": chosen.attempt}
        # What is there now, in as many reads as it takes.
        data = bytearray()
        at = 0
        while True:
            resp = self._send("GET", path, params={**params, "offset": at})
            try:
                nxt = int(resp.headers.get("x-next-offset", "0"))
            except ValueError:
                nxt = 0
            if not resp.content or nxt <= at:
                break
            data += resp.content
            at = nxt
        lines = data.split(b"\n")
        partial = lines.pop()  # after the last newline: a line still being written, or nothing
        if follow and partial:
            # The stream starts at that line, so that it comes whole.
            at -= len(partial)
        elif partial:
            lines.append(partial)
        shown = lines if tail is None else lines[max(0, len(lines) - tail) :] if tail else []
        for raw in shown:
            text = raw.decode("utf-8", errors="replace")
            yield LogLine.parse(text.removesuffix("\r"), replica=name, attempt=chosen.attempt)
        if not follow:
            return
        yield from self._follow(path, {**params, "offset": at, "follow": "true"}, name, chosen.attempt)

    def _pick_attempt(
        self, task_id: str, attempt: int | None, wait_for_it: bool, poll: float
    ) -> AttemptReplicas | None:
        while True:
            data = self._get(_task_path(task_id) + "/logs")
            attempts = _build(lambda d: [AttemptReplicas.from_json(a) for a in d["items"]], data)
            if attempt is None:
                if attempts:
                    return attempts[0]
            else:
                for a in attempts:
                    if a.attempt == attempt:
                        return a
            current = self._get_by_id(task_id)
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
            time.sleep(poll)

    def _follow(self, path: str, params: Mapping[str, str | int], replica: str, attempt: int) -> Iterator[LogLine]:
        timeout = httpx.Timeout(self.timeout, read=max(_STREAM_READ_TIMEOUT, self.timeout))
        headers = {"Accept": "text/event-stream"}
        try:
            with self._http.stream("GET", path, params=params, headers=headers, timeout=timeout) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    raise ProblemError.from_response(
                        resp.status_code, resp.text, method="GET", url=str(resp.request.url)
                    )
                for ev in _sse.events(_sse.split_lines(resp.iter_bytes())):
                    if ev.event == "end":
                        return
                    if ev.event != "message":
                        continue
                    # The server sends one log line per event, so the line breaks left inside one (a data
                    # field each) were carriage returns in the line (a progress bar's).
                    yield LogLine.parse("\r".join(ev.data), replica=replica, attempt=attempt)
        except httpx.TimeoutException as e:
            raise TrainyardConnectionError(
                f"the log stream of {replica} went quiet for over {timeout.read} s ({e})", url=self.url
            ) from e
        except httpx.TransportError as e:
            raise TrainyardConnectionError(f"the log stream of {replica} broke: {e}", url=self.url) from e


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
