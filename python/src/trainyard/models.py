"""What the API answers with, as typed, read-only dataclasses.

Each is built from the server's JSON by ``from_json``, with the field names in Python's spelling
(``projectGroup`` is ``project_group``); every one keeps the JSON it was built from in ``raw``, so a field a
newer server adds is not lost. Every time is an aware :class:`~datetime.datetime` in UTC (the API's are
milliseconds since the epoch, kept as such in ``raw``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

from ._problems import FieldProblem

__all__ = [
    "TERMINAL_STATUSES",
    "Admission",
    "AttemptReplicas",
    "Event",
    "LogLine",
    "MetricSeries",
    "Metrics",
    "Page",
    "Placement",
    "PlacementReplica",
    "QueueHolder",
    "QueuePosition",
    "Replica",
    "ReplicaShape",
    "RunResult",
    "Status",
    "Task",
    "TaskDemand",
    "User",
    "Validation",
]


class Status(enum.StrEnum):
    """Where a task is in its life. Members compare equal to the server's strings (``"Running"``)."""

    QUEUED = "Queued"
    ADMITTED = "Admitted"
    STARTING = "Starting"
    PRECHECKING = "Prechecking"
    RUNNING = "Running"
    STOPPING = "Stopping"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    STOPPED = "Stopped"

    @classmethod
    def parse(cls, value: str | Status) -> Status:
        """A status from its name in any case (``"running"``, ``"RUNNING"``); ValueError if unknown."""
        if isinstance(value, Status):
            return value
        for s in cls:
            if s.value.lower() == value.strip().lower():
                return s
        known = ", ".join(s.value for s in cls)
        raise ValueError(f"status {value!r} is not one of {known}")

    @property
    def is_terminal(self) -> bool:
        """Done for good: nothing more happens unless someone resubmits the task."""
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES: frozenset[Status] = frozenset({Status.SUCCEEDED, Status.FAILED, Status.STOPPED})
"""What :meth:`trainyard.Client.wait` waits for unless told otherwise."""


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def _from_ms(ms: Any) -> datetime:
    """One of the API's times (ms since the epoch), exactly, as an aware datetime in UTC."""
    return _EPOCH + int(ms) * _MS


def _to_ms(at: datetime) -> int:
    """An aware datetime as the API's ms since the epoch; a naive one is refused, its zone being a guess."""
    if not isinstance(at, datetime):
        raise TypeError(f"a time is an aware datetime, not {type(at).__name__}")
    if at.utcoffset() is None:
        raise ValueError(f"{at!r} has no time zone: give an aware datetime (datetime.now(UTC), say)")
    return (at - _EPOCH) // _MS


def _from_text(text: str) -> datetime | None:
    """An RFC 3339 time as an aware datetime in UTC; ``None`` if it is not one."""
    if not text[:1].isdigit() or "T" not in text:
        return None
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        return None
    return at.replace(tzinfo=UTC) if at.utcoffset() is None else at.astimezone(UTC)


@dataclass(frozen=True, slots=True)
class Share:
    """A user a task is shared with, and whether they may operate it (stop, resubmit, clone, delete)."""

    user: str
    operate: bool

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Share:
        return cls(user=str(d["user"]), operate=bool(d["operate"]))


@dataclass(frozen=True, slots=True)
class QueueHolder:
    """A running task that holds capacity a queued task could use. No task has a time limit, so when it frees
    is not known: only since when it runs."""

    id: str
    name: str
    owner: str
    project_group: str
    spends_its_quota: bool
    """Of the queued task's group and resource type: it spends the same quota."""
    units: int
    """Units it holds of the queued task's instance spec (``spec``, the first of them)."""
    spec: str
    running_since: datetime
    stopping: bool
    """Told to stop already: its resources are about to come free."""

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> QueueHolder:
        return cls(
            id=str(d["id"]),
            name=str(d["name"]),
            owner=str(d["owner"]),
            project_group=str(d["projectGroup"]),
            spends_its_quota=bool(d["spendsItsQuota"]),
            units=int(d["units"]),
            spec=str(d["spec"]),
            running_since=_from_ms(d["runningSinceMs"]),
            stopping=bool(d["stopping"]),
        )


@dataclass(frozen=True, slots=True)
class QueuePosition:
    """Where a queued task stands as of the control loop's last tick, and why it waits."""

    position: int
    position_in_group: int
    reason: str
    holders: list[QueueHolder] | None = None
    """One task's view only (``get``; ``None`` in lists): the running tasks that hold what it waits for, as far
    as the caller may see them, those spending its group's quota first."""
    more_holders: int | None = None
    """Holders not listed: ones the caller may not see, and any beyond the first few (``None`` in lists)."""

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> QueuePosition:
        holders = d.get("holders")
        more = d.get("moreHolders")
        return cls(
            position=int(d["position"]),
            position_in_group=int(d["positionInGroup"]),
            reason=str(d["reason"]),
            holders=[QueueHolder.from_json(h) for h in holders] if isinstance(holders, list) else None,
            more_holders=int(more) if more is not None else None,
        )


@dataclass(frozen=True, slots=True)
class StartingWait:
    """What a starting task's attempt waits for, in its backend's words (a cluster's scheduler with no room, a
    pull), and since when."""

    reason: str
    since: datetime

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StartingWait:
        return cls(reason=str(d["reason"]), since=_from_ms(d["sinceMs"]))


@dataclass(frozen=True, slots=True)
class PlacementReplica:
    """One replica of a placed attempt: its role, index and rank, the node it runs on and its share."""

    role: str
    index: int
    rank: int
    node: str
    resources: dict[str, int]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PlacementReplica:
        return cls(
            role=str(d["role"]),
            index=int(d["index"]),
            rank=int(d["rank"]),
            node=str(d["node"]),
            resources={str(k): int(v) for k, v in dict(d.get("resources") or {}).items()},
        )


@dataclass(frozen=True, slots=True)
class Placement:
    """Where an attempt runs: the instance-spec option chosen, each replica's node, and the units counted
    against quota as ``(spec, resource type, units)``."""

    option: int
    replicas: list[PlacementReplica]
    units: list[tuple[str, str, int]]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Placement:
        return cls(
            option=int(d["option"]),
            replicas=[PlacementReplica.from_json(r) for r in d.get("replicas") or []],
            units=[(str(u[0]), str(u[1]), int(u[2])) for u in d.get("units") or []],
        )


@dataclass(frozen=True, slots=True)
class ReplicaShape:
    """Replicas alike: how many, and the GPUs, vCPUs and memory one takes on its node."""

    replicas: int
    gpus: int
    vcpus: int
    memory_mib: int

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> ReplicaShape:
        return cls(
            replicas=int(d["replicas"]), gpus=int(d["gpus"]), vcpus=int(d["vcpus"]), memory_mib=int(d["memoryMib"])
        )


@dataclass(frozen=True, slots=True)
class TaskDemand:
    """What a task asks for with its first instance-spec option, as summed when it was created: its replicas
    by shape (the master or head first), how many options it lists, and ``accelerator`` ``"gpu"`` when any
    option asks for GPUs, else ``"cpu"``."""

    shapes: list[ReplicaShape]
    options: int
    accelerator: str

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TaskDemand:
        return cls(
            shapes=[ReplicaShape.from_json(x) for x in d.get("shapes") or []],
            options=int(d["options"]),
            accelerator=str(d["accelerator"]),
        )


@dataclass(frozen=True, slots=True)
class Task:
    """A task as the API shows it. ``spec`` (hidden values masked) is ``None`` in lists; ``get`` has it."""

    id: str
    name: str
    owner: str
    owner_deleted: bool
    """An admin deleted the owner's account; the task is kept for the record."""
    project_group: str
    type: str
    """``PyTorchJob`` or ``RayJob``."""
    status: Status
    public: bool
    labels: dict[str, str]
    attempt: int
    retries: int
    created_at: datetime
    updated_at: datetime
    deleted: bool
    """Deleted: out of lists and not run again; still read by id, with its history."""
    placement: Placement | None
    queue: QueuePosition | None
    starting: StartingWait | None
    """While its attempt is admitted and starting: what it waits for; ``None`` otherwise."""
    demand: TaskDemand | None
    """``None`` for a task the server stored before it kept demands."""
    status_since: datetime
    """When it entered its status."""
    run_started_at: datetime | None
    """When its attempt entered Running; ``None`` until then (and again once it is queued)."""
    spec: dict[str, Any] | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Task:
        placement = d.get("placement")
        queue = d.get("queue")
        starting = d.get("starting")
        demand = d.get("demand")
        run_started = d.get("runStartedAtMs")
        spec = d.get("spec")
        return cls(
            id=str(d["id"]),
            name=str(d["name"]),
            owner=str(d["owner"]),
            owner_deleted=bool(d.get("ownerDeleted", False)),
            project_group=str(d["projectGroup"]),
            type=str(d["type"]),
            status=Status.parse(str(d["status"])),
            public=bool(d["public"]),
            labels={str(k): str(v) for k, v in dict(d.get("labels") or {}).items()},
            attempt=int(d["attempt"]),
            retries=int(d["retries"]),
            created_at=_from_ms(d["createdAtMs"]),
            updated_at=_from_ms(d["updatedAtMs"]),
            deleted=bool(d.get("deleted", False)),
            placement=Placement.from_json(placement) if isinstance(placement, dict) else None,
            queue=QueuePosition.from_json(queue) if isinstance(queue, dict) else None,
            starting=StartingWait.from_json(starting) if isinstance(starting, dict) else None,
            demand=TaskDemand.from_json(demand) if isinstance(demand, dict) else None,
            status_since=_from_ms(d.get("statusSinceMs") or d["updatedAtMs"]),
            run_started_at=_from_ms(run_started) if run_started is not None else None,
            spec=spec if isinstance(spec, dict) else None,
            raw=d,
        )

    @property
    def is_terminal(self) -> bool:
        """Succeeded, Failed or Stopped."""
        return self.status.is_terminal


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a list; ``next_cursor`` (``None`` on the last page) asks for the next one."""

    items: list[T]
    next_cursor: str | None

    def __iter__(self) -> Iterator[T]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)


@dataclass(frozen=True, slots=True)
class Event:
    """One event of a task's history, with its attempt and a stable reason code (``Started``, ...)."""

    seq: int
    attempt: int
    at: datetime
    reason: str
    message: str

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Event:
        return cls(
            seq=int(d["seq"]),
            attempt=int(d["attempt"]),
            at=_from_ms(d["atMs"]),
            reason=str(d["reason"]),
            message=str(d["message"]),
        )


@dataclass(frozen=True, slots=True)
class Replica:
    """A replica by its full name (``hello-ab12c-worker-0``), with its role."""

    name: str
    role: str

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Replica:
        return cls(name=str(d["name"]), role=str(d["role"]))


@dataclass(frozen=True, slots=True)
class AttemptReplicas:
    """The replicas one attempt of a task had (their logs can be read)."""

    attempt: int
    replicas: list[Replica]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> AttemptReplicas:
        return cls(attempt=int(d["attempt"]), replicas=[Replica.from_json(r) for r in d.get("replicas") or []])


@dataclass(frozen=True, slots=True)
class LogLine:
    """One line of a replica's log. ``str(line)`` is its text."""

    replica: str
    attempt: int
    text: str
    time: datetime | None
    """When it was written (as the server stored it, to the millisecond); ``None`` when the line had no time."""
    stream: str
    """``O`` (standard output) or ``E`` (standard error); empty when unknown."""

    @classmethod
    def parse(cls, stored: str, *, replica: str, attempt: int) -> LogLine:
        """A line in the server's stored form, ``TIME STREAM TEXT``; another line is kept as its text."""
        parts = stored.split(" ", 2)
        at = _from_text(parts[0]) if len(parts) >= 2 and parts[1] in ("O", "E") else None
        if at is not None:
            text = parts[2] if len(parts) == 3 else ""
            return cls(replica=replica, attempt=attempt, time=at, stream=parts[1], text=text)
        return cls(replica=replica, attempt=attempt, time=None, stream="", text=stored)

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True, slots=True)
class MetricSeries:
    """One metric of one replica with one label set; ``points`` are ``(at, value)``, oldest first."""

    replica: str
    name: str
    labels: dict[str, str]
    points: list[tuple[datetime, float]]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> MetricSeries:
        return cls(
            replica=str(d["replica"]),
            name=str(d["name"]),
            labels={str(k): str(v) for k, v in dict(d.get("labels") or {}).items()},
            points=[(_from_ms(p[0]), float(p[1])) for p in d.get("points") or []],
        )

    @property
    def values(self) -> list[float]:
        return [v for _, v in self.points]

    @property
    def last(self) -> float | None:
        """The newest value, if any."""
        return self.points[-1][1] if self.points else None


@dataclass(frozen=True, slots=True)
class Metrics:
    """A task's metrics for one attempt: preset ones are named ``trainyard_*``, the rest are the task's own."""

    attempt: int
    series: list[MetricSeries]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Metrics:
        return cls(attempt=int(d["attempt"]), series=[MetricSeries.from_json(s) for s in d.get("series") or []])

    def named(self, name: str) -> list[MetricSeries]:
        """The series of one metric (one per replica and label set)."""
        return [s for s in self.series if s.name == name]


@dataclass(frozen=True, slots=True)
class User:
    """A user with their role (``admin`` or ``member``) and project groups."""

    name: str
    role: str
    groups: list[str]

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> User:
        return cls(name=str(d["name"]), role=str(d["role"]), groups=[str(g) for g in d.get("groups") or []])


@dataclass(frozen=True, slots=True)
class Admission:
    """Whether the scheduler would admit a task now, and why not."""

    now: bool
    reason: str


@dataclass(frozen=True, slots=True)
class Validation:
    """A task document checked without creating it (``Client.validate``)."""

    valid: bool
    problems: list[FieldProblem]
    """Every problem found, each with its field path (warnings too when valid)."""
    admission: Admission | None
    demand: list[dict[str, Any]] | None
    """The demand of each instance-spec option, as the server computed it (when valid)."""
    task: dict[str, Any] | None
    """The document as the server read it, defaults filled in."""
    yaml: str | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Validation:
        adm = d.get("admission")
        demand = d.get("demand")
        task = d.get("task")
        yaml_text = d.get("yaml")
        return cls(
            valid=bool(d["valid"]),
            problems=[FieldProblem.from_json(p) for p in d.get("problems") or [] if isinstance(p, dict)],
            admission=Admission(now=bool(adm["now"]), reason=str(adm["reason"])) if isinstance(adm, dict) else None,
            demand=[x for x in demand if isinstance(x, dict)] if isinstance(demand, list) else None,
            task=task if isinstance(task, dict) else None,
            yaml=yaml_text if isinstance(yaml_text, str) else None,
            raw=d,
        )


@dataclass(frozen=True, slots=True)
class BulkDeleted:
    """What :meth:`Client.delete_matching` did: the tasks deleted, by id, and those that matched but could
    not be deleted, as ``(id, reason)``."""

    deleted: int
    ids: list[str]
    failed: list[tuple[str, str]]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> BulkDeleted:
        return cls(
            deleted=int(d["deleted"]),
            ids=[str(i) for i in d["ids"]],
            failed=[(str(f["id"]), str(f["detail"])) for f in d["failed"]],
        )


@dataclass(frozen=True, slots=True)
class RunResult:
    """How :meth:`Client.run` ended: the task as last seen, its status, and ``exit_code``, what ``trainyard
    run`` exits with: 0 when it succeeded, the failed command's own exit code (1 to 255) when the failure
    states one, 4 when it was stopped, else 1. Detached (``detach=True``), the task as submitted, and
    ``exit_code`` ``None``."""

    task: Task
    status: Status
    exit_code: int | None
    message: str
    """The task's last event's message (why it failed, say); empty when detached."""
    workdir: str | None
    """The working directory's id, when one went with it."""

    @property
    def ok(self) -> bool:
        """It succeeded."""
        return self.status is Status.SUCCEEDED
