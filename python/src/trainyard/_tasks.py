"""The task operations: find, submit, list, wait for, stop, resubmit, clone, share and delete tasks, and read
their events and metrics."""

from __future__ import annotations

import builtins
import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, TypeAlias
from urllib.parse import quote

import httpx

from ._transport import _build, _json_of, _Transport
from .errors import PROBLEM_TYPE_PREFIX, NotFound, WaitTimeout
from .models import (
    TERMINAL_STATUSES,
    BulkDeleted,
    Event,
    Metrics,
    Page,
    Share,
    Status,
    Task,
    Validation,
)

TaskRef: TypeAlias = str | Task
"""A task's name, its id, or a :class:`Task` (whose id is used as it is)."""

SpecLike: TypeAlias = Mapping[str, Any] | str | bytes | os.PathLike[str]
"""A task document: a mapping (sent as JSON), YAML or JSON text, or a file's path."""

SortOrder: TypeAlias = Literal["newest", "oldest", "name", "updated"]
# Tasks that ask for GPUs (in any of their instance-spec options), or tasks that ask for none.
Accelerator: TypeAlias = Literal["gpu", "cpu"]

# How many tasks a name lookup reads, as the CLI does (an exact name or id is found first, alone).
_RESOLVE_LIMIT = 50
# The server's most events per answer: a shorter page is the last.
_EVENTS_PAGE = 1000


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


class _Tasks(_Transport):
    """The task operations of the :class:`~trainyard.Client`."""

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


def _task_path(task_id: str) -> str:
    return "/api/v1/tasks/" + quote(task_id, safe="")


def _task(resp: httpx.Response) -> Task:
    return _build(Task.from_json, _json_of(resp))


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
