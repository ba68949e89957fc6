"""The client: one object per server and token, over the server's HTTP API (``/api/v1``)."""

from __future__ import annotations

import builtins
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeAlias, TypeVar
from urllib.parse import quote

import httpx
import yaml

from . import _sse
from .errors import (
    PROBLEM_TYPE_PREFIX,
    NotFound,
    ProblemError,
    TrainyardConnectionError,
    TrainyardError,
    UnexpectedResponse,
    WaitTimeout,
)
from .models import (
    TERMINAL_STATUSES,
    AttemptReplicas,
    BulkDeleted,
    Event,
    LogLine,
    Metrics,
    Page,
    Share,
    Status,
    Task,
    User,
    Validation,
)

__all__ = ["DEFAULT_SERVER", "Client", "SpecLike", "TaskRef"]

__version__ = "0.1.0"

DEFAULT_SERVER = "http://127.0.0.1:8080"

TaskRef: TypeAlias = str | Task
"""A task's name, its id, or a :class:`Task` (whose id is used as it is)."""

SpecLike: TypeAlias = Mapping[str, Any] | str | bytes | os.PathLike[str]
"""A task document: a mapping (sent as JSON), YAML or JSON text, or a file's path."""

SortOrder: TypeAlias = Literal["newest", "oldest", "name", "updated"]
# Tasks that ask for GPUs (in any of their instance-spec options), or tasks that ask for none.
Accelerator: TypeAlias = Literal["gpu", "cpu"]

_R = TypeVar("_R")

# How many tasks a name lookup reads, as the CLI does (an exact name or id is found first, alone).
_RESOLVE_LIMIT = 50
# The server's most events per answer: a shorter page is the last.
_EVENTS_PAGE = 1000
# A followed log stream sends a keep-alive every 15 s; a read that waits longer than this means it is gone.
_STREAM_READ_TIMEOUT = 60.0



def _task_filters(
    status: str | Status | None,
    task_type: str | None,
    group: str | None,
    owner: str | None,
    search: str | None,
    labels: Mapping[str, str] | str | None,
    accelerator: Accelerator | None = None,
) -> dict[str, str | int]:
    """The task list's filters as query parameters (the list and the bulk delete take the same ones)."""
    params: dict[str, str | int] = {}
    if status is not None:
        params["status"] = Status.parse(status).value
    for key, value in (
        ("type", task_type),
        ("group", group),
        ("owner", owner),
        ("q", search),
        ("accelerator", accelerator),
    ):
        if value is not None:
            params[key] = value
    if labels is not None:
        params["labels"] = labels if isinstance(labels, str) else ",".join(f"{k}={v}" for k, v in labels.items())
    return params

class Client:
    """A Trainyard server, as one user (the token's).

    >>> with Client("http://127.0.0.1:8080", token) as c:
    ...     task = c.submit(Path("examples/local/hello.yaml"))
    ...     task = c.wait(task)

    Every method that names a task takes its name, its id or a :class:`Task`. A refusal raises a
    :class:`~trainyard.errors.ProblemError` subclass; an unreachable server a
    :class:`~trainyard.errors.TrainyardConnectionError`.
    """

    def __init__(
        self,
        url: str = DEFAULT_SERVER,
        token: str | None = None,
        *,
        timeout: float = 30.0,
        verify: bool | str = True,
    ) -> None:
        """``url``: the server (``http://host:8080``); ``token``: an API token (``ty_...``); ``timeout``:
        seconds any one request may take (a followed log waits as long as the replica runs); ``verify``:
        TLS verification (``False``, or a CA bundle's path)."""
        self.url = url.rstrip("/")
        self.timeout = timeout
        headers = {"User-Agent": f"trainyard-python/{__version__}", "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout, verify=verify)

    @classmethod
    def from_env(cls, *, config: str | os.PathLike[str] | None = None, timeout: float = 30.0) -> Client:
        """A client configured as the CLI is: ``TRAINYARD_SERVER`` and ``TRAINYARD_TOKEN``, then the config
        file (``config``, ``TRAINYARD_CONFIG`` or ``~/.config/trainyard/config.yaml``, with ``server:`` and
        ``token:``), then ``http://127.0.0.1:8080`` and the admin token ``trainyard up`` saved in
        ``.trainyard/admin.token``."""
        explicit = config if config is not None else os.environ.get("TRAINYARD_CONFIG")
        path = Path(explicit) if explicit else Path.home() / ".config" / "trainyard" / "config.yaml"
        settings: dict[str, Any] = {}
        try:
            loaded = yaml.safe_load(path.read_text())
        except FileNotFoundError:
            if explicit:
                raise
            loaded = None
        if loaded is not None:
            if not isinstance(loaded, dict):
                raise TrainyardError(f"{path}: expected a mapping with server: and token:")
            settings = loaded
        server = os.environ.get("TRAINYARD_SERVER") or settings.get("server") or DEFAULT_SERVER
        token = os.environ.get("TRAINYARD_TOKEN") or settings.get("token")
        if not token:
            try:
                token = Path(".trainyard/admin.token").read_text().strip() or None
            except OSError:
                token = None
        return cls(str(server), str(token) if token else None, timeout=timeout)

    # --- the connection ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Closes the connections; the client cannot be used after."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        try:
            resp = self._http.request(method, path, params=params, content=content, headers=headers)
        except httpx.TimeoutException as e:
            raise TrainyardConnectionError(
                f"{method} {self.url}{path}: no answer within {self.timeout} s ({e})", url=self.url
            ) from e
        except httpx.TransportError as e:
            raise TrainyardConnectionError(
                f"cannot reach {self.url}: {e} (is `trainyard up` running?)", url=self.url
            ) from e
        if resp.status_code >= 400:
            raise ProblemError.from_response(resp.status_code, resp.text, method=method, url=str(resp.request.url))
        return resp

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        json_body: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        """Any API call (``client.request("GET", "/api/v1/quota")``): its JSON, or ``None`` when it has no
        body; refusals raise as everywhere. For what the methods here do not cover (the admin API)."""
        content = None
        hdrs = dict(headers or {})
        if json_body is not None:
            content = json.dumps(json_body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        resp = self._send(method, path, params=params, content=content, headers=hdrs)
        if not resp.content:
            return None
        return _json_of(resp)

    def _get(self, path: str, params: Mapping[str, str | int] | None = None) -> Any:
        return _json_of(self._send("GET", path, params=params))

    # --- tasks ------------------------------------------------------------------------------------------

    def resolve(self, task: TaskRef) -> str:
        """The id of the task ``task`` names (its name or its id) among those the caller can see, as the CLI
        finds it: a list search, then the item whose id or name is exactly ``task``. A :class:`Task` is its
        own id. :class:`~trainyard.errors.NotFound` if there is none."""
        if isinstance(task, Task):
            return task.id
        if not isinstance(task, str) or not task:
            raise TypeError(f"a task is named by its name, its id or a Task, not {task!r}")
        page = self._get("/api/v1/tasks", {"q": task, "limit": _RESOLVE_LIMIT})
        items = page.get("items") if isinstance(page, dict) else None
        for t in items if isinstance(items, list) else []:
            if isinstance(t, dict) and (t.get("id") == task or t.get("name") == task):
                return str(t["id"])
        raise NotFound(
            status=404,
            type=PROBLEM_TYPE_PREFIX + "not-found",
            title="Not found",
            detail=f"no task named {task!r} (or with that id) among those you can see",
            method="GET",
            url=f"{self.url}/api/v1/tasks?q={quote(task, safe='')}",
        )

    def submit(self, spec: SpecLike, *, idempotency_key: str | None = None) -> Task:
        """Creates a task from a document: a mapping, YAML or JSON text, or a file's path (a
        :class:`~pathlib.Path`, or a string with no line break naming a file or ending in ``.yaml``, ``.yml``
        or ``.json``). With ``idempotency_key``, a retry with the same key and document returns the first
        task; the same key with another document is a :class:`~trainyard.errors.Conflict`. A document with
        problems raises :class:`~trainyard.errors.ValidationError` listing each with its field path."""
        body, content_type = _document(spec)
        headers = {"Content-Type": content_type}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        return _task(self._send("POST", "/api/v1/tasks", content=body, headers=headers))

    def validate(self, spec: SpecLike) -> Validation:
        """Checks a document without creating anything: every problem, and when it is valid its demand and
        whether the scheduler would admit it now. Problems are returned, not raised."""
        body, content_type = _document(spec)
        data = _json_of(self._send("POST", "/api/v1/validate", content=body, headers={"Content-Type": content_type}))
        return _build(Validation.from_json, data)

    def get(self, task: TaskRef) -> Task:
        """The task, with its spec (hidden values masked)."""
        return _task(self._send("GET", _task_path(self.resolve(task))))

    def list(
        self,
        *,
        status: str | Status | None = None,
        task_type: str | None = None,
        group: str | None = None,
        owner: str | None = None,
        search: str | None = None,
        labels: Mapping[str, str] | str | None = None,
        accelerator: Accelerator | None = None,
        sort: SortOrder | None = None,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Page[Task]:
        """One page of the tasks the caller can see, newest first unless ``sort`` says otherwise (``oldest``,
        ``name``, ``updated``). ``status`` in any case; ``task_type`` ``PyTorchJob`` or ``RayJob``;
        ``search`` a name or id, or part of one; ``labels`` all of these ``key=value``; ``group`` one project
        group or several as ``"a,b"``; ``accelerator`` ``"gpu"`` (tasks that ask for GPUs) or ``"cpu"`` (tasks
        that ask for none); ``limit`` per page (server default 50, at most 500). Pass the page's
        ``next_cursor`` as ``cursor`` for the next one."""
        params = _task_filters(status, task_type, group, owner, search, labels, accelerator)
        if sort is not None:
            params["sort"] = sort
        if limit is not None:
            params["limit"] = limit
        if cursor is not None:
            params["cursor"] = cursor
        data = self._get("/api/v1/tasks", params)

        def page(d: Any) -> Page[Task]:
            return Page(items=[Task.from_json(t) for t in d["items"]], next_cursor=d.get("nextCursor"))

        return _build(page, data)

    def iter_tasks(
        self,
        *,
        status: str | Status | None = None,
        task_type: str | None = None,
        group: str | None = None,
        owner: str | None = None,
        search: str | None = None,
        labels: Mapping[str, str] | str | None = None,
        accelerator: Accelerator | None = None,
        sort: SortOrder | None = None,
        page_size: int = 100,
    ) -> Iterator[Task]:
        """Every task :meth:`list` would find, page after page, read as it is iterated."""
        cursor: str | None = None
        while True:
            page = self.list(
                status=status,
                task_type=task_type,
                group=group,
                owner=owner,
                search=search,
                labels=labels,
                accelerator=accelerator,
                sort=sort,
                limit=page_size,
                cursor=cursor,
            )
            yield from page.items
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def list_all(
        self,
        *,
        status: str | Status | None = None,
        task_type: str | None = None,
        group: str | None = None,
        owner: str | None = None,
        search: str | None = None,
        labels: Mapping[str, str] | str | None = None,
        accelerator: Accelerator | None = None,
        sort: SortOrder | None = None,
        page_size: int = 100,
    ) -> builtins.list[Task]:
        """:meth:`iter_tasks`, as a list."""
        return builtins.list(
            self.iter_tasks(
                status=status,
                task_type=task_type,
                group=group,
                owner=owner,
                search=search,
                labels=labels,
                accelerator=accelerator,
                sort=sort,
                page_size=page_size,
            )
        )

    def wait(
        self,
        task: TaskRef,
        *,
        until: Iterable[str | Status] | str | Status | None = None,
        timeout: float | None = None,
        poll: float = 1.0,
    ) -> Task:
        """Polls the task every ``poll`` seconds until its status is one of ``until`` (default: Succeeded,
        Failed or Stopped) or it has ended, and returns it as then seen. Raises
        :class:`~trainyard.errors.WaitTimeout` (with the task as last seen) after ``timeout`` seconds."""
        if isinstance(until, (str, Status)):
            wanted = {Status.parse(until)}
        elif until is None:
            wanted = set(TERMINAL_STATUSES)
        else:
            wanted = {Status.parse(s) for s in until}
        if poll <= 0:
            raise ValueError("poll must be positive")
        task_id = self.resolve(task)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            current = self._get_by_id(task_id)
            if current.status in wanted or current.is_terminal:
                return current
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    want = ", ".join(sorted(s.value for s in wanted))
                    raise WaitTimeout(
                        f"task {current.name} is still {current.status.value} after {timeout} s (waited for {want})",
                        task=current,
                    )
                time.sleep(min(poll, left))
            else:
                time.sleep(poll)

    def _get_by_id(self, task_id: str) -> Task:
        return _task(self._send("GET", _task_path(task_id)))

    def stop(self, task: TaskRef) -> Task:
        """Stops the task: a queued one at once, a running one through Stopping (with the checkpoint
        window). :class:`~trainyard.errors.Conflict` if it has already ended."""
        return _task(self._send("POST", _task_path(self.resolve(task)) + "/stop"))

    def resubmit(self, task: TaskRef) -> Task:
        """Runs an ended task again as a new attempt (back to Queued). :class:`~trainyard.errors.Conflict`
        while it runs, or once deleted."""
        return _task(self._send("POST", _task_path(self.resolve(task)) + "/resubmit"))

    def clone(
        self,
        task: TaskRef,
        *,
        project_group: str | None = None,
        name_prefix: str | None = None,
        hidden_values: Mapping[str, str] | None = None,
    ) -> Task:
        """A new task (new name, queued, owned by the caller) from this one's spec, in ``project_group``
        and named from ``name_prefix`` (each: the original's by default). Hidden env values are never
        copied: give each in ``hidden_values`` by variable name, or the server refuses with a
        :class:`~trainyard.errors.ValidationError`."""
        body: dict[str, Any] = {}
        if project_group is not None:
            body["projectGroup"] = project_group
        if name_prefix is not None:
            body["namePrefix"] = name_prefix
        if hidden_values:
            body["hiddenValues"] = dict(hidden_values)
        content = json.dumps(body).encode() if body else None
        headers = {"Content-Type": "application/json"} if body else None
        return _task(self._send("POST", _task_path(self.resolve(task)) + "/clone", content=content, headers=headers))

    def share(self, task: TaskRef, user: str, *, operate: bool = False) -> None:
        """Lets ``user`` see the task (and with ``operate`` stop, resubmit, clone and delete it). The owner
        and admins only: :class:`~trainyard.errors.Forbidden` otherwise."""
        body = json.dumps({"user": user, "operate": operate}).encode()
        self._send(
            "POST",
            _task_path(self.resolve(task)) + "/shares",
            content=body,
            headers={"Content-Type": "application/json"},
        )

    def shares(self, task: TaskRef) -> builtins.list[Share]:
        """Whom the task is shared with (the owner and admins may ask)."""
        data = self._get(_task_path(self.resolve(task)) + "/shares")
        return [_build(Share.from_json, x) for x in data["items"]]

    def unshare(self, task: TaskRef, user: str) -> None:
        """Takes the share of ``user`` back (the owner and admins; a user may give back their own).
        :class:`~trainyard.errors.NotFound` when the task is not shared with them."""
        self._send("DELETE", _task_path(self.resolve(task)) + "/shares/" + quote(user, safe=""))

    def delete(self, task: TaskRef) -> None:
        """Stops the task if it runs (with the checkpoint window) and deletes it: it leaves lists, and its
        history is kept."""
        self._send("DELETE", _task_path(self.resolve(task)))

    def delete_matching(
        self,
        *,
        status: str | Status | None = None,
        task_type: str | None = None,
        group: str | None = None,
        owner: str | None = None,
        search: str | None = None,
        labels: Mapping[str, str] | str | None = None,
        accelerator: Accelerator | None = None,
    ) -> BulkDeleted:
        """Deletes every task the caller may operate that matches the filters (at least one; the server
        never deletes without one), as :meth:`delete` does each, page by page until none is left. Tasks that
        matched but could not be deleted are in ``failed`` with the server's reason."""
        params = _task_filters(status, task_type, group, owner, search, labels, accelerator)
        if not params:
            raise ValueError(
                "say which tasks to delete: at least one of status, task_type, group, owner, search, labels, accelerator"
            )
        ids: builtins.list[str] = []
        while True:
            data = _json_of(self._send("DELETE", "/api/v1/tasks", params=params))
            page = _build(lambda d: BulkDeleted.from_json(d), data)
            ids.extend(page.ids)
            if not data.get("more") or not page.ids:
                return BulkDeleted(deleted=len(ids), ids=ids, failed=page.failed)

    def events(self, task: TaskRef, *, after: int = 0) -> builtins.list[Event]:
        """The task's history in order (every attempt's), after sequence number ``after``."""
        task_id = self.resolve(task)
        out: builtins.list[Event] = []
        while True:
            data = self._get(_task_path(task_id) + "/events", {"after": after})
            page = _build(lambda d: [Event.from_json(e) for e in d["items"]], data)
            out.extend(page)
            if len(page) < _EVENTS_PAGE:
                return out
            after = page[-1].seq

    def metrics(
        self,
        task: TaskRef,
        *,
        attempt: int | None = None,
        since: int | datetime | None = None,
        name: str | None = None,
    ) -> Metrics:
        """The task's metrics (latest attempt unless ``attempt``): one series per replica, metric and label
        set. ``since``: only samples after this time (a datetime, or Unix ms); ``name``: only this metric."""
        params: dict[str, str | int] = {}
        if attempt is not None:
            params["attempt"] = attempt
        if since is not None:
            params["since"] = int(since.timestamp() * 1000) if isinstance(since, datetime) else int(since)
        if name is not None:
            params["name"] = name
        return _build(Metrics.from_json, self._get(_task_path(self.resolve(task)) + "/metrics", params))

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

    # --- the caller -------------------------------------------------------------------------------------

    def whoami(self) -> User:
        """The token's user: name, role and project groups."""
        return _build(User.from_json, self._get("/api/v1/whoami"))


def _task_path(task_id: str) -> str:
    return "/api/v1/tasks/" + quote(task_id, safe="")


def _json_of(resp: httpx.Response) -> Any:
    try:
        return resp.json()
    except ValueError as e:
        raise UnexpectedResponse(
            f"{resp.request.method} {resp.request.url} answered {resp.status_code} with a body that is not JSON"
        ) from e


def _build(make: Callable[[Any], _R], data: Any) -> _R:
    """``make(data)``, an answer whose shape is not the documented one being an UnexpectedResponse."""
    try:
        return make(data)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        raise UnexpectedResponse(f"the server's answer does not have the expected shape ({e!r}): {data!r:.500}") from e


def _task(resp: httpx.Response) -> Task:
    return _build(Task.from_json, _json_of(resp))


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


_DOCUMENT_SUFFIXES = (".yaml", ".yml", ".json")


def _document(spec: SpecLike) -> tuple[bytes, str]:
    """A task document's bytes and content type."""
    if isinstance(spec, Mapping):
        return json.dumps(spec).encode(), "application/json"
    if isinstance(spec, bytes):
        return spec, "application/yaml"
    if isinstance(spec, str):
        if "\n" not in spec and (spec.lower().endswith(_DOCUMENT_SUFFIXES) or os.path.isfile(spec)):
            return _file(Path(spec))
        return spec.encode(), "application/yaml"
    if isinstance(spec, os.PathLike):
        return _file(Path(os.fspath(spec)))
    raise TypeError(f"a task document is a mapping, YAML or JSON text, or a file's path; not {type(spec).__name__}")


def _file(path: Path) -> tuple[bytes, str]:
    body = path.read_bytes()
    return body, "application/json" if path.suffix.lower() == ".json" else "application/yaml"
