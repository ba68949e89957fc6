"""The task operations as plans (see ``_plan``): find, submit, list, wait for, stop, resubmit, clone, share and
delete tasks, and read their events and metrics. The clients' methods say what each does."""

from __future__ import annotations

import copy
import json
import os
import re
import time
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, TypeAlias
from urllib.parse import quote

import yaml

from . import _workdir
from ._plan import Emit, Items, Plan, build, get_json, json_of, send, sleep
from .errors import PROBLEM_TYPE_PREFIX, NotFound, UsageError, WaitTimeout
from .models import (
    TERMINAL_STATUSES,
    BulkDeleted,
    Event,
    Metrics,
    Page,
    Share,
    Status,
    Task,
    User,
    Validation,
    _to_ms,
)

TaskRef: TypeAlias = str | Task
"""A task's name, its id, or a :class:`Task` (whose id is used as it is)."""

SpecLike: TypeAlias = Mapping[str, Any] | str | bytes | os.PathLike[str]
"""A task document: a mapping (sent as JSON), YAML or JSON text, or a file's path."""

SortOrder: TypeAlias = Literal["newest", "oldest", "name", "updated"]
# Tasks that ask for GPUs (in any of their instance-spec options), or tasks that ask for none.
Accelerator: TypeAlias = Literal["gpu", "cpu"]

Params: TypeAlias = dict[str, str | int]

# How many tasks a name lookup reads, as the CLI does (an exact name or id is found first, alone).
_RESOLVE_LIMIT = 50
# The server's most events per answer: a shorter page is the last.
_EVENTS_PAGE = 1000


def task_filters(
    status: str | Status | None,
    task_type: str | None,
    group: str | None,
    owner: str | None,
    search: str | None,
    labels: Mapping[str, str] | str | None,
    accelerator: Accelerator | None,
) -> Params:
    """The task list's filters as query parameters (the list and the bulk delete take the same ones)."""
    params: Params = {}
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


def list_params(filters: Params, sort: SortOrder | None, limit: int | None, cursor: str | None) -> Params:
    """A list's query: the filters, and the order and page."""
    params = dict(filters)
    for key, value in (("sort", sort), ("limit", limit), ("cursor", cursor)):
        if value is not None:
            params[key] = value
    return params


# --- the caller and lookups -------------------------------------------------------------------------------


def whoami() -> Plan[User]:
    return build(User.from_json, (yield from get_json("/api/v1/whoami")))


def resolve(task: TaskRef) -> Plan[str]:
    """The id of the task ``task`` names, as the CLI finds it: a list search, then the item whose id or name is
    exactly ``task``. A :class:`Task` is its own id."""
    if isinstance(task, Task):
        return task.id
    if not isinstance(task, str) or not task:
        raise TypeError(f"a task is named by its name, its id or a Task, not {task!r}")
    resp = yield from send("GET", "/api/v1/tasks", params={"q": task, "limit": _RESOLVE_LIMIT})
    page = json_of(resp)
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
        url=str(resp.request.url),
    )


def task_path(task_id: str) -> str:
    return "/api/v1/tasks/" + quote(task_id, safe="")


def get_by_id(task_id: str) -> Plan[Task]:
    return build(Task.from_json, (yield from get_json(task_path(task_id))))


def _task_call(
    method: str, path: str, content: bytes | None = None, headers: Mapping[str, str] | None = None
) -> Plan[Task]:
    resp = yield from send(method, path, content=content, headers=headers)
    return build(Task.from_json, json_of(resp))


# --- tasks ------------------------------------------------------------------------------------------------


def submit(
    spec: SpecLike, idempotency_key: str | None, workdir: str | os.PathLike[str] | None = None
) -> Plan[Task]:
    if workdir is None:
        body, content_type = _document(spec)
        return (yield from submit_json(body, idempotency_key, content_type))
    doc = _parsed(spec)
    metadata = doc.get("metadata")
    group = metadata.get("projectGroup") if isinstance(metadata, dict) else None
    if not isinstance(group, str) or not group:
        raise UsageError(
            "a working directory needs a task document that names metadata.projectGroup, whose working "
            "directories it joins"
        )
    task_spec = doc.get("spec")
    env = task_spec.get("environment") if isinstance(task_spec, dict) else None
    if not isinstance(env, dict):
        raise UsageError("a working directory needs a task document with spec.environment, where it is named")
    env["workdir"] = yield from _workdir.upload(workdir, group)
    return (yield from submit_json(json.dumps(doc).encode(), idempotency_key))


def submit_json(
    body: bytes, idempotency_key: str | None, content_type: str = "application/json"
) -> Plan[Task]:
    """Creates a task from a document's bytes."""
    headers = {"Content-Type": content_type}
    if idempotency_key is not None:
        headers["Idempotency-Key"] = idempotency_key
    return (yield from _task_call("POST", "/api/v1/tasks", body, headers))


def validate(spec: SpecLike) -> Plan[Validation]:
    body, content_type = _document(spec)
    resp = yield from send("POST", "/api/v1/validate", content=body, headers={"Content-Type": content_type})
    return build(Validation.from_json, json_of(resp))


def get(task: TaskRef) -> Plan[Task]:
    return (yield from get_by_id((yield from resolve(task))))


def list_page(params: Params) -> Plan[Page[Task]]:
    def page(d: Any) -> Page[Task]:
        return Page(items=[Task.from_json(t) for t in d["items"]], next_cursor=d.get("nextCursor"))

    return build(page, (yield from get_json("/api/v1/tasks", params)))


def iter_tasks(filters: Params, sort: SortOrder | None, page_size: int) -> Items[Task]:
    cursor: str | None = None
    while True:
        page = yield from list_page(list_params(filters, sort, page_size, cursor))
        for t in page.items:
            yield Emit(t)
        if not page.next_cursor:
            return
        cursor = page.next_cursor


def wait(
    task: TaskRef,
    until: Iterable[str | Status] | str | Status | None,
    timeout: float | None,
    poll: float,
) -> Plan[Task]:
    if isinstance(until, (str, Status)):
        wanted = {Status.parse(until)}
    elif until is None:
        wanted = set(TERMINAL_STATUSES)
    else:
        wanted = {Status.parse(s) for s in until}
    if poll <= 0:
        raise ValueError("poll must be positive")
    task_id = yield from resolve(task)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        current = yield from get_by_id(task_id)
        if current.status in wanted or current.is_terminal:
            return current
        if deadline is None:
            yield from sleep(poll)
            continue
        left = deadline - time.monotonic()
        if left <= 0:
            want = ", ".join(sorted(s.value for s in wanted))
            raise WaitTimeout(
                f"task {current.name} is still {current.status.value} after {timeout} s (waited for {want})",
                task=current,
            )
        yield from sleep(min(poll, left))


def stop(task: TaskRef) -> Plan[Task]:
    return (yield from _task_call("POST", task_path((yield from resolve(task))) + "/stop"))


def resubmit(task: TaskRef) -> Plan[Task]:
    return (yield from _task_call("POST", task_path((yield from resolve(task))) + "/resubmit"))


def clone(
    task: TaskRef,
    project_group: str | None,
    name_prefix: str | None,
    hidden_values: Mapping[str, str] | None,
) -> Plan[Task]:
    body: dict[str, Any] = {}
    if project_group is not None:
        body["projectGroup"] = project_group
    if name_prefix is not None:
        body["namePrefix"] = name_prefix
    if hidden_values:
        body["hiddenValues"] = dict(hidden_values)
    content = json.dumps(body).encode() if body else None
    headers = {"Content-Type": "application/json"} if body else None
    return (yield from _task_call("POST", task_path((yield from resolve(task))) + "/clone", content, headers))


def share(task: TaskRef, user: str, operate: bool) -> Plan[None]:
    body = json.dumps({"user": user, "operate": operate}).encode()
    path = task_path((yield from resolve(task))) + "/shares"
    yield from send("POST", path, content=body, headers={"Content-Type": "application/json"})


def shares(task: TaskRef) -> Plan[list[Share]]:
    data = yield from get_json(task_path((yield from resolve(task))) + "/shares")
    return build(lambda d: [Share.from_json(x) for x in d["items"]], data)


def unshare(task: TaskRef, user: str) -> Plan[None]:
    yield from send("DELETE", task_path((yield from resolve(task))) + "/shares/" + quote(user, safe=""))


def delete(task: TaskRef) -> Plan[None]:
    yield from send("DELETE", task_path((yield from resolve(task))))


def delete_matching(filters: Params) -> Plan[BulkDeleted]:
    if not filters:
        raise ValueError(
            "say which tasks to delete: at least one of status, task_type, group, owner, search, labels, accelerator"
        )
    ids: list[str] = []
    while True:
        data = json_of((yield from send("DELETE", "/api/v1/tasks", params=filters)))
        page = build(BulkDeleted.from_json, data)
        ids.extend(page.ids)
        if not data.get("more") or not page.ids:
            return BulkDeleted(deleted=len(ids), ids=ids, failed=page.failed)


def events(task: TaskRef, after: int) -> Plan[list[Event]]:
    task_id = yield from resolve(task)
    out: list[Event] = []
    while True:
        data = yield from get_json(task_path(task_id) + "/events", {"after": after})
        page = build(lambda d: [Event.from_json(e) for e in d["items"]], data)
        out.extend(page)
        if len(page) < _EVENTS_PAGE:
            return out
        after = page[-1].seq


def metrics(task: TaskRef, attempt: int | None, since: datetime | None, name: str | None) -> Plan[Metrics]:
    params: Params = {}
    if attempt is not None:
        params["attempt"] = attempt
    if since is not None:
        params["since"] = _to_ms(since)
    if name is not None:
        params["name"] = name
    path = task_path((yield from resolve(task))) + "/metrics"
    return build(Metrics.from_json, (yield from get_json(path, params)))


def request(
    method: str,
    path: str,
    params: Mapping[str, str | int] | None,
    json_body: Any,
    headers: Mapping[str, str] | None,
) -> Plan[Any]:
    content = None
    hdrs = dict(headers or {})
    if json_body is not None:
        content = json.dumps(json_body).encode()
        hdrs.setdefault("Content-Type", "application/json")
    resp = yield from send(method, path, params=params, content=content, headers=hdrs)
    return json_of(resp) if resp.content else None


# --- documents --------------------------------------------------------------------------------------------

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


class _CoreSchemaLoader(yaml.SafeLoader):
    """YAML as the server reads it (the 1.2 core schema): ``yes``, ``no``, ``on`` and ``off`` are text, as are
    dates and ``1:20``; ``017`` is seventeen."""

    yaml_implicit_resolvers: dict[Any, Any] = {}


for _tag, _pattern, _first in [
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", list("tTfF")),
    ("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", list("-+0123456789")),
    (
        "tag:yaml.org,2002:float",
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        list("-+0123456789."),
    ),
    ("tag:yaml.org,2002:merge", r"^(?:<<)$", ["<"]),
]:
    _CoreSchemaLoader.add_implicit_resolver(_tag, re.compile(_pattern), _first)


def _core_int(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> int:
    text = str(loader.construct_scalar(node))
    if text.startswith("0o"):
        return int(text[2:], 8)
    if text.startswith("0x"):
        return int(text[2:], 16)
    return int(text, 10)


_CoreSchemaLoader.add_constructor("tag:yaml.org,2002:int", _core_int)


def _parsed(spec: SpecLike) -> dict[str, Any]:
    """A task document as a mapping to change (a copy of one given as a mapping)."""
    if isinstance(spec, Mapping):
        return copy.deepcopy(dict(spec))
    body, content_type = _document(spec)
    try:
        doc = json.loads(body) if content_type == "application/json" else yaml.load(body, Loader=_CoreSchemaLoader)
    except (ValueError, yaml.YAMLError) as e:
        raise UsageError(f"a working directory needs a task document that parses (it names the group): {e}") from e
    if not isinstance(doc, dict):
        raise UsageError("a working directory needs a task document that is a mapping")
    return doc


def _file(path: Path) -> tuple[bytes, str]:
    body = path.read_bytes()
    return body, "application/json" if path.suffix.lower() == ".json" else "application/yaml"
