"""The clients: one object per server and token, over the server's HTTP API (``/api/v1``). :class:`Client`
blocks; :class:`AsyncClient` has the same methods to await. Both run the same operations (``_tasks``,
``_logs``), so that they send the same requests and raise the same errors."""

from __future__ import annotations

import builtins
import inspect
import os
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from . import _logs, _run, _tasks, _workdir
from ._run import RunDefaults, TaskType
from ._tasks import Accelerator, SortOrder, SpecLike, TaskRef
from ._transport import DEFAULT_SERVER, _AsyncConnection, _Connection
from ._transport import __version__ as __version__
from .errors import TrainyardError
from .models import (
    AttemptReplicas,
    BulkDeleted,
    Event,
    LogLine,
    Metrics,
    Page,
    RunResult,
    Share,
    Status,
    Task,
    User,
    Validation,
)

__all__ = ["DEFAULT_SERVER", "AsyncClient", "Client", "RunDefaults", "SpecLike", "TaskRef", "TaskType"]


def _settings(config: str | os.PathLike[str] | None) -> tuple[str, str | None, RunDefaults]:
    """The server, token and ``run`` defaults as the CLI finds them (see :meth:`Client.from_env`)."""
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
    defaults = RunDefaults.from_config(settings.get("defaults"), str(path))
    return str(server), str(token) if token else None, defaults


def _printer(workers: int) -> Callable[[LogLine], None]:
    """What ``run`` does with output by default: each line on standard output, after ``[replica] `` when there
    are several, as ``trainyard run`` prints it."""

    def show(line: LogLine) -> None:
        print(f"[{line.replica}] {line.text}" if workers > 0 else line.text, flush=True)

    return show


class Client(_Connection):
    """A Trainyard server, as one user (the token's).

    >>> with Client("http://127.0.0.1:8080", token) as c:
    ...     task = c.submit(Path("examples/local/hello.yaml"))
    ...     task = c.wait(task)

    Every method that names a task takes its name, its id or a :class:`Task`. A refusal raises a
    :class:`~trainyard.errors.ProblemError` subclass; an unreachable server a
    :class:`~trainyard.errors.TrainyardConnectionError`. Every time taken or returned is an aware datetime
    (the ones returned in UTC).
    """

    run_defaults: RunDefaults = RunDefaults()
    """What :meth:`run` takes where its arguments leave a choice open: the config file's ``defaults:`` when
    made by :meth:`from_env`, else none."""

    @classmethod
    def from_env(cls, *, config: str | os.PathLike[str] | None = None, timeout: float = 30.0) -> Client:
        """A client configured as the CLI is: ``TRAINYARD_SERVER`` and ``TRAINYARD_TOKEN``, then the config
        file (``config``, ``TRAINYARD_CONFIG`` or ``~/.config/trainyard/config.yaml``, with ``server:`` and
        ``token:``), then ``http://127.0.0.1:8080`` and the admin token ``trainyard up`` saved in
        ``.trainyard/admin.token``."""
        server, token, defaults = _settings(config)
        c = cls(server, token, timeout=timeout)
        c.run_defaults = defaults
        return c

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
        return self._run(_tasks.request(method, path, params, json_body, headers))

    # --- the caller -------------------------------------------------------------------------------------

    def whoami(self) -> User:
        """The token's user: name, role and project groups."""
        return self._run(_tasks.whoami())

    # --- tasks ------------------------------------------------------------------------------------------

    def resolve(self, task: TaskRef) -> str:
        """The id of the task ``task`` names (its name or its id) among those the caller can see, as the CLI
        finds it: a list search, then the item whose id or name is exactly ``task``. A :class:`Task` is its
        own id. :class:`~trainyard.errors.NotFound` if there is none."""
        return self._run(_tasks.resolve(task))

    def submit(
        self,
        spec: SpecLike,
        *,
        workdir: str | os.PathLike[str] | None = None,
        idempotency_key: str | None = None,
    ) -> Task:
        """Creates a task from a document: a mapping, YAML or JSON text, or a file's path (a
        :class:`~pathlib.Path`, or a string with no line break naming a file or ending in ``.yaml``, ``.yml``
        or ``.json``). With ``idempotency_key``, a retry with the same key and document returns the first
        task; the same key with another document is a :class:`~trainyard.errors.Conflict`. A document with
        problems raises :class:`~trainyard.errors.ValidationError` listing each with its field path.

        With ``workdir``, that directory goes with the task, as ``trainyard submit --workdir`` sends it: it
        is uploaded for the document's ``metadata.projectGroup`` (:meth:`upload_workdir`) and named in
        ``spec.environment.workdir``, and each replica starts in a copy of it (the document goes as JSON)."""
        return self._run(_tasks.submit(spec, idempotency_key, workdir))

    def upload_workdir(self, path: str | os.PathLike[str], group: str) -> str:
        """Uploads a directory as a working directory of project group ``group`` and returns its id (what
        ``spec.environment.workdir`` takes), as the CLI does: every entry git would keep (``.gitignore``
        files, nested and in the directories above, ``.git/info/exclude`` and a ``.trainyardignore`` are
        honoured; ``.git`` stays home), links kept as links, then only the files the server does not hold
        yet are sent (in tar streams of about 32 MiB), then the manifest is kept. The same tree uploaded
        again sends no file, and its id is the one the CLI gets for it.

        A directory that cannot go as it is (a link that is absolute or leads out of it, a socket, FIFO or
        device, a name that is not UTF-8, a file that cannot be read) raises
        :class:`~trainyard.errors.WorkdirError` listing every problem, before anything is sent."""
        return self._run(_workdir.upload(path, group))

    def run(
        self,
        cmd: str | Sequence[str],
        *,
        workdir: str | os.PathLike[str] | None = ".",
        workers: int = 0,
        gpus: int = 0,
        group: str | None = None,
        pool: str | None = None,
        spec: str | None = None,
        image: str | None = None,
        resource_type: str | None = None,
        type: TaskType = "PyTorchJob",  # noqa: A002 - the task's type, as the API names it
        name_prefix: str = "run",
        max_resubmissions: int | None = None,
        follow: bool = True,
        output: Callable[[LogLine], object] | None = None,
        detach: bool = False,
    ) -> RunResult:
        """Runs one command as a task, as ``trainyard run [OPTIONS] -- CMD`` does, and returns how it ended.

        ``cmd``: a list of arguments (each one word, quoted for the shell as needed) or a shell line. It runs
        on every replica of a PyTorchJob (a master and ``workers`` workers) or as a RayJob's entrypoint
        (``type="RayJob"``: a head and ``workers`` workers). ``workdir`` (by default the current directory;
        ``None`` sends none) goes with it, as :meth:`upload_workdir` sends it. Group, pool, instance spec,
        image and resource type are the arguments, else :attr:`run_defaults` (the config file's
        ``defaults:``), else the catalog's first fit for the caller's group: the quota line whose spec has
        the fewest GPUs that are at least ``gpus`` (none for 0), and the ``host`` image where the group may
        use it, else the first it may. Nothing that fits is a :class:`~trainyard.errors.UsageError` saying
        what the group has. ``max_resubmissions`` turns fault tolerance on (an attempt that fails for the
        platform's reasons is resubmitted up to that many times).

        With ``follow`` (the default), every replica's output of each attempt in turn is handed to
        ``output`` line by line as it is written (by default printed, after ``[replica] `` when there are
        several); without it, the task is only waited for. ``detach`` returns once it is submitted.
        :attr:`RunResult.exit_code` is what the CLI would exit with: 0, or the failed command's own exit
        code."""
        args = _run.RunArgs(
            cmd=_run.command_line(cmd),
            workdir=workdir,
            workers=workers,
            gpus=gpus,
            group=group,
            pool=pool,
            spec=spec,
            image=image,
            resource_type=resource_type,
            task_type=type,
            name_prefix=name_prefix,
            max_resubmissions=max_resubmissions,
            follow=follow,
            detach=detach,
        )
        return self._run_streaming(_run.run(args, self.run_defaults), output or _printer(workers))

    def validate(self, spec: SpecLike) -> Validation:
        """Checks a document without creating anything: every problem, and when it is valid its demand and
        whether the scheduler would admit it now. Problems are returned, not raised."""
        return self._run(_tasks.validate(spec))

    def get(self, task: TaskRef) -> Task:
        """The task, with its spec (hidden values masked)."""
        return self._run(_tasks.get(task))

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
        filters = _tasks.task_filters(status, task_type, group, owner, search, labels, accelerator)
        return self._run(_tasks.list_page(_tasks.list_params(filters, sort, limit, cursor)))

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
        filters = _tasks.task_filters(status, task_type, group, owner, search, labels, accelerator)
        return self._iterate(_tasks.iter_tasks(filters, sort, page_size))

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
        filters = _tasks.task_filters(status, task_type, group, owner, search, labels, accelerator)
        return builtins.list(self._iterate(_tasks.iter_tasks(filters, sort, page_size)))

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
        return self._run(_tasks.wait(task, until, timeout, poll))

    def stop(self, task: TaskRef) -> Task:
        """Stops the task: a queued one at once, a running one through Stopping (with the checkpoint
        window). :class:`~trainyard.errors.Conflict` if it has already ended."""
        return self._run(_tasks.stop(task))

    def resubmit(self, task: TaskRef) -> Task:
        """Runs an ended task again as a new attempt (back to Queued). :class:`~trainyard.errors.Conflict`
        while it runs, or once deleted."""
        return self._run(_tasks.resubmit(task))

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
        return self._run(_tasks.clone(task, project_group, name_prefix, hidden_values))

    def share(self, task: TaskRef, user: str, *, operate: bool = False) -> None:
        """Lets ``user`` see the task (and with ``operate`` stop, resubmit, clone and delete it). The owner
        and admins only: :class:`~trainyard.errors.Forbidden` otherwise."""
        self._run(_tasks.share(task, user, operate))

    def shares(self, task: TaskRef) -> builtins.list[Share]:
        """Whom the task is shared with (the owner and admins may ask)."""
        return self._run(_tasks.shares(task))

    def unshare(self, task: TaskRef, user: str) -> None:
        """Takes the share of ``user`` back (the owner and admins; a user may give back their own).
        :class:`~trainyard.errors.NotFound` when the task is not shared with them."""
        self._run(_tasks.unshare(task, user))

    def delete(self, task: TaskRef) -> None:
        """Stops the task if it runs (with the checkpoint window) and deletes it: it leaves lists, and its
        history is kept."""
        self._run(_tasks.delete(task))

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
        filters = _tasks.task_filters(status, task_type, group, owner, search, labels, accelerator)
        return self._run(_tasks.delete_matching(filters))

    def events(self, task: TaskRef, *, after: int = 0) -> builtins.list[Event]:
        """The task's history in order (every attempt's), after sequence number ``after``."""
        return self._run(_tasks.events(task, after))

    def metrics(
        self,
        task: TaskRef,
        *,
        attempt: int | None = None,
        since: datetime | None = None,
        name: str | None = None,
    ) -> Metrics:
        """The task's metrics (latest attempt unless ``attempt``): one series per replica, metric and label
        set. ``since``: only samples after this time (an aware datetime); ``name``: only this metric."""
        return self._run(_tasks.metrics(task, attempt, since, name))

    # --- logs -------------------------------------------------------------------------------------------

    def replicas(self, task: TaskRef) -> builtins.list[AttemptReplicas]:
        """The replicas each attempt had, newest attempt first (empty before the first one starts)."""
        return self._run(_logs.replicas(task))

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
        _logs.check(tail, poll)
        task_id = self._run(_tasks.resolve(task))
        return self._iterate(_logs.lines(task_id, replica, attempt, tail, follow, poll))


class AsyncClient(_AsyncConnection):
    """A Trainyard server, as one user, for asyncio: :class:`Client`'s methods, to await, over an
    ``httpx.AsyncClient``.

    >>> async with AsyncClient("http://127.0.0.1:8080", token) as c:
    ...     task = await c.submit(Path("examples/local/hello.yaml"))
    ...     async for line in c.logs(task, follow=True):
    ...         print(line)

    :meth:`logs` and :meth:`iter_tasks` are not awaited: they return async iterators, which look the task up
    (or read the first page) when first iterated. Each method is documented as :class:`Client`'s.
    """

    @classmethod
    def from_env(cls, *, config: str | os.PathLike[str] | None = None, timeout: float = 30.0) -> AsyncClient:
        """As :meth:`Client.from_env` (the config file is read at once)."""
        server, token, defaults = _settings(config)
        c = cls(server, token, timeout=timeout)
        c.run_defaults = defaults
        return c

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    run_defaults: RunDefaults = RunDefaults()

    def __repr__(self) -> str:
        return f"AsyncClient({self.url!r})"

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str | int] | None = None,
        json_body: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> Any:
        return await self._run(_tasks.request(method, path, params, json_body, headers))

    async def whoami(self) -> User:
        return await self._run(_tasks.whoami())

    async def resolve(self, task: TaskRef) -> str:
        return await self._run(_tasks.resolve(task))

    async def submit(
        self,
        spec: SpecLike,
        *,
        workdir: str | os.PathLike[str] | None = None,
        idempotency_key: str | None = None,
    ) -> Task:
        return await self._run(_tasks.submit(spec, idempotency_key, workdir))

    async def upload_workdir(self, path: str | os.PathLike[str], group: str) -> str:
        """As :meth:`Client.upload_workdir`; the files are read and hashed in a worker thread."""
        return await self._run(_workdir.upload(path, group))

    async def run(
        self,
        cmd: str | Sequence[str],
        *,
        workdir: str | os.PathLike[str] | None = ".",
        workers: int = 0,
        gpus: int = 0,
        group: str | None = None,
        pool: str | None = None,
        spec: str | None = None,
        image: str | None = None,
        resource_type: str | None = None,
        type: TaskType = "PyTorchJob",  # noqa: A002 - the task's type, as the API names it
        name_prefix: str = "run",
        max_resubmissions: int | None = None,
        follow: bool = True,
        output: Callable[[LogLine], object] | None = None,
        detach: bool = False,
    ) -> RunResult:
        """As :meth:`Client.run`; ``output`` may be a coroutine function, each line awaited in turn."""
        args = _run.RunArgs(
            cmd=_run.command_line(cmd),
            workdir=workdir,
            workers=workers,
            gpus=gpus,
            group=group,
            pool=pool,
            spec=spec,
            image=image,
            resource_type=resource_type,
            task_type=type,
            name_prefix=name_prefix,
            max_resubmissions=max_resubmissions,
            follow=follow,
            detach=detach,
        )
        return await self._run_streaming(_run.run(args, self.run_defaults), output or _printer(workers))

    async def validate(self, spec: SpecLike) -> Validation:
        return await self._run(_tasks.validate(spec))

    async def get(self, task: TaskRef) -> Task:
        return await self._run(_tasks.get(task))

    async def list(
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
        filters = _tasks.task_filters(status, task_type, group, owner, search, labels, accelerator)
        return await self._run(_tasks.list_page(_tasks.list_params(filters, sort, limit, cursor)))

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
    ) -> AsyncGenerator[Task, None]:
        filters = _tasks.task_filters(status, task_type, group, owner, search, labels, accelerator)
        return self._iterate(_tasks.iter_tasks(filters, sort, page_size))

    async def list_all(
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
        filters = _tasks.task_filters(status, task_type, group, owner, search, labels, accelerator)
        return [t async for t in self._iterate(_tasks.iter_tasks(filters, sort, page_size))]

    async def wait(
        self,
        task: TaskRef,
        *,
        until: Iterable[str | Status] | str | Status | None = None,
        timeout: float | None = None,
        poll: float = 1.0,
    ) -> Task:
        return await self._run(_tasks.wait(task, until, timeout, poll))

    async def stop(self, task: TaskRef) -> Task:
        return await self._run(_tasks.stop(task))

    async def resubmit(self, task: TaskRef) -> Task:
        return await self._run(_tasks.resubmit(task))

    async def clone(
        self,
        task: TaskRef,
        *,
        project_group: str | None = None,
        name_prefix: str | None = None,
        hidden_values: Mapping[str, str] | None = None,
    ) -> Task:
        return await self._run(_tasks.clone(task, project_group, name_prefix, hidden_values))

    async def share(self, task: TaskRef, user: str, *, operate: bool = False) -> None:
        await self._run(_tasks.share(task, user, operate))

    async def shares(self, task: TaskRef) -> builtins.list[Share]:
        return await self._run(_tasks.shares(task))

    async def unshare(self, task: TaskRef, user: str) -> None:
        await self._run(_tasks.unshare(task, user))

    async def delete(self, task: TaskRef) -> None:
        await self._run(_tasks.delete(task))

    async def delete_matching(
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
        filters = _tasks.task_filters(status, task_type, group, owner, search, labels, accelerator)
        return await self._run(_tasks.delete_matching(filters))

    async def events(self, task: TaskRef, *, after: int = 0) -> builtins.list[Event]:
        return await self._run(_tasks.events(task, after))

    async def metrics(
        self,
        task: TaskRef,
        *,
        attempt: int | None = None,
        since: datetime | None = None,
        name: str | None = None,
    ) -> Metrics:
        return await self._run(_tasks.metrics(task, attempt, since, name))

    async def replicas(self, task: TaskRef) -> builtins.list[AttemptReplicas]:
        return await self._run(_logs.replicas(task))

    def logs(
        self,
        task: TaskRef,
        *,
        replica: str | None = None,
        attempt: int | None = None,
        tail: int | None = None,
        follow: bool = False,
        poll: float = 0.5,
    ) -> AsyncGenerator[LogLine, None]:
        """As :meth:`Client.logs`, as an async iterator (``async for line in c.logs(task, follow=True)``), except
        that the task is looked up when it is first iterated: a :class:`~trainyard.errors.NotFound` is raised
        there. To leave a followed log early and close its stream at once, iterate it in
        ``contextlib.aclosing(...)``."""
        _logs.check(tail, poll)
        return self._iterate(_logs.lines_of(task, replica, attempt, tail, follow, poll))


# The async methods do what the blocking ones do: they carry the same documentation (the differences are in
# AsyncClient's own).
for _name, _method in vars(AsyncClient).items():
    if inspect.isfunction(_method) and _method.__doc__ is None and hasattr(Client, _name):
        _method.__doc__ = getattr(Client, _name).__doc__
del _name, _method
