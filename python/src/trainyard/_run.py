"""``run``: one command as a task, as ``trainyard run [OPTIONS] -- CMD`` makes it (a plan, see ``_plan``). What
it runs on comes from the arguments, then the config file's ``defaults:``, then the first fit in the catalog
for the caller's group; the working directory goes with it; every replica's output of each attempt is
followed in turn; the result carries the exit status the CLI would exit with."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from . import _logs, _workdir
from ._plan import Emit, Merge, Plan, Streaming, get_json, sleep
from ._tasks import events, get_by_id, submit_json
from .errors import UsageError
from .models import TERMINAL_STATUSES, LogLine, RunResult, Status, Task

TaskType: TypeAlias = Literal["PyTorchJob", "RayJob"]

# How often the state of a task is looked at while it starts or between attempts, as the CLI does.
_START_LOOK_S = 1.0
_BETWEEN_ATTEMPTS_S = 0.5
# What `trainyard run` exits with for a stopped task, and for a failure that states no exit code.
EXIT_STOPPED = 4
EXIT_FAILED = 1


@dataclass(frozen=True, slots=True)
class RunDefaults:
    """What :meth:`~trainyard.Client.run` takes when its arguments leave it open: the config file's
    ``defaults:`` (``group``, ``pool``, ``spec``, ``image``, ``resourceType``), read by ``from_env``."""

    group: str | None = None
    pool: str | None = None
    spec: str | None = None
    image: str | None = None
    resource_type: str | None = None

    @classmethod
    def from_config(cls, d: Any, where: str) -> RunDefaults:
        """The ``defaults:`` mapping of a config file (``where`` names it in errors)."""
        if d is None:
            return cls()
        if not isinstance(d, Mapping):
            raise UsageError(f"{where}: defaults: is a mapping of group, pool, spec, image, resourceType")
        names = {"group": "group", "pool": "pool", "spec": "spec", "image": "image", "resourceType": "resource_type"}
        unknown = sorted(str(k) for k in d if k not in names)
        if unknown:
            raise UsageError(f"{where}: defaults: has no {', '.join(unknown)} (it takes {', '.join(names)})")
        return cls(**{names[k]: str(v) for k, v in d.items() if v is not None})


@dataclass(frozen=True, slots=True)
class Choice:
    """Where the task runs."""

    group: str
    resource_type: str
    pool: str
    spec: str
    image: str
    region: str
    cluster: str


_PLAIN = re.compile(r"[A-Za-z0-9\-_./=:,+@%^]+")


def command_line(cmd: str | Sequence[str]) -> str:
    """The task's ``cmd``: a string as it is (a shell line), a sequence each argument one word, as an exec
    would pass it (quoted for ``bash -c`` unless it is plainly one word)."""
    if isinstance(cmd, str):
        return cmd
    words = []
    for arg in cmd:
        if not isinstance(arg, str):
            raise TypeError(f"a command's arguments are strings, not {type(arg).__name__}")
        words.append(arg if _PLAIN.fullmatch(arg) else "'" + arg.replace("'", "'\\''") + "'")
    return " ".join(words)


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _gpus(cat: Mapping[str, Any], spec: str) -> int:
    s = (cat.get("instanceSpecs") or {}).get(spec)
    g = s.get("gpus") if isinstance(s, dict) else None
    return g if isinstance(g, int) and not isinstance(g, bool) and g >= 0 else 0


def _names(v: Any) -> list[str]:
    return [x for x in v if isinstance(x, str)] if isinstance(v, list) else []


def choose(
    *,
    group: str | None,
    pool: str | None,
    spec: str | None,
    image: str | None,
    resource_type: str | None,
    gpus: int,
    ray: bool,
    defaults: RunDefaults,
    me: Mapping[str, Any],
    cat: Mapping[str, Any],
) -> Choice:
    """Picks what the arguments and defaults leave open from the catalog, as ``trainyard run`` does: the first
    quota line of the group that fits (its spec has the GPUs asked for: none for ``gpus`` 0; the fewest that
    fit), and an image the group may use there (one with Ray for a RayJob; ``host`` first where the group may
    use it). :class:`UsageError` when nothing fits, saying what the group has."""
    admin = me.get("role") == "admin"
    my_groups = _names(me.get("groups"))
    pgs = cat.get("projectGroups")
    # The CLI reads the catalog's maps in key order.
    catalog_groups = sorted(pgs) if isinstance(pgs, dict) else []
    chosen_group = group or defaults.group or (my_groups[0] if my_groups else None)
    if chosen_group is None and admin and catalog_groups:
        chosen_group = catalog_groups[0]
    if chosen_group is None:
        raise UsageError("you are in no project group; ask an admin, or pass group=")
    resource_type = resource_type or defaults.resource_type
    pool = pool or defaults.pool
    spec = spec or defaults.spec
    quotas = [q for q in cat.get("quotas") or [] if isinstance(q, dict)]
    of_group = [q for q in quotas if q.get("group") == chosen_group]
    lines = [
        q
        for q in of_group
        if (resource_type is None or q.get("resourceType") == resource_type)
        and (pool is None or q.get("pool") == pool)
        and (spec is None or q.get("spec") == spec)
    ]
    line: Mapping[str, Any] | None
    if spec is not None:
        line = lines[0] if lines else None
    else:
        def gpus_of(q: Mapping[str, Any]) -> int:
            return _gpus(cat, _str(q.get("spec")))

        fits = [q for q in lines if (gpus_of(q) == 0 if gpus == 0 else gpus_of(q) >= gpus)]
        # The fewest GPUs that fit; the first of those in the catalog's order.
        line = min(fits, key=gpus_of) if fits else None
    if line is None:
        has = [
            f"{_str(q.get('resourceType'))} {_str(q.get('pool'))} {_str(q.get('spec'))} "
            f"({_gpus(cat, _str(q.get('spec')))} GPUs)"
            for q in of_group
        ]
        asked = f" {gpus} GPUs a replica" if gpus > 0 else " a CPU-only replica"
        withs = "".join(f" with {v}" for v in (resource_type, pool, spec) if v is not None)
        raise UsageError(
            f"project group {chosen_group} has no quota that fits{asked}{withs}; it has: "
            + (", ".join(has) if has else "none")
        )
    chosen_pool = _str(line.get("pool"))
    pool_entry = (cat.get("pools") or {}).get(chosen_pool)
    cluster = _str(pool_entry.get("cluster")) if isinstance(pool_entry, dict) else ""
    cluster_entry = (cat.get("clusters") or {}).get(cluster)
    region = _str(cluster_entry.get("region")) if isinstance(cluster_entry, dict) else ""

    def usable(name: str, i: Any) -> bool:
        if not isinstance(i, dict):
            return False
        groups = _names(i.get("projectGroups"))
        clusters = _names(i.get("clusters"))
        for_group = (admin or chosen_group in groups) if name == "host" else (not groups or chosen_group in groups)
        return for_group and (not clusters or cluster in clusters) and (not ray or i.get("ray") is True)

    chosen_image = image or defaults.image
    if chosen_image is None:
        images = cat.get("images") if isinstance(cat.get("images"), dict) else {}
        assert isinstance(images, dict)
        if "host" in images and usable("host", images["host"]):
            chosen_image = "host"
        else:
            chosen_image = next((n for n in sorted(images) if usable(n, images[n])), None)
        if chosen_image is None:
            raise UsageError(
                f"no catalog image {'with Ray ' if ray else ''}is offered to project group {chosen_group} on "
                f"cluster {cluster}; pass image="
            )
    return Choice(
        group=chosen_group,
        resource_type=_str(line.get("resourceType")),
        pool=chosen_pool,
        spec=_str(line.get("spec")),
        image=chosen_image,
        region=region,
        cluster=cluster,
    )


def document(
    choice: Choice, cmd: str, *, task_type: TaskType, workers: int, name_prefix: str, max_resubmissions: int | None
) -> dict[str, Any]:
    """The task document ``run`` submits."""
    doc: dict[str, Any] = {
        "apiVersion": "trainyard.dev/v1",
        "kind": "TrainingTask",
        "metadata": {"namePrefix": name_prefix, "projectGroup": choice.group},
        "spec": {
            "type": task_type,
            "placement": {"region": choice.region, "cluster": choice.cluster},
            "environment": {"image": choice.image, "cmd": cmd},
            "compute": {
                "resourceType": choice.resource_type,
                "pool": choice.pool,
                "workers": workers,
                "instanceSpecs": [{"spec": choice.spec}],
            },
        },
    }
    if max_resubmissions is not None:
        doc["spec"]["advanced"] = {"faultTolerance": {"enabled": True, "maxResubmissions": max_resubmissions}}
    return doc


def exit_code_in(message: str) -> int | None:
    """The exit code an event's message states (``... exited with code 3 ...``)."""
    _, sep, rest = message.partition(" exited with code ")
    if not sep:
        return None
    digits = re.match(r"[0-9-]*", rest)
    try:
        return int(digits.group(0)) if digits else None
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class RunArgs:
    """What :meth:`~trainyard.Client.run` was asked, checked."""

    cmd: str
    workdir: str | os.PathLike[str] | None
    workers: int
    gpus: int
    group: str | None
    pool: str | None
    spec: str | None
    image: str | None
    resource_type: str | None
    task_type: TaskType
    name_prefix: str
    max_resubmissions: int | None
    follow: bool
    detach: bool

    def __post_init__(self) -> None:
        if not self.cmd.strip():
            raise UsageError('say what to run: run(["python3", "train.py"]), or a shell line')
        for name, n in (("workers", self.workers), ("gpus", self.gpus)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 0:
                raise ValueError(f"{name} is a whole number, 0 or more; not {n!r}")
        if self.max_resubmissions is not None and (
            isinstance(self.max_resubmissions, bool) or self.max_resubmissions < 0
        ):
            raise ValueError(f"max_resubmissions is 0 or more; not {self.max_resubmissions!r}")
        if self.task_type not in ("PyTorchJob", "RayJob"):
            raise ValueError(f"type is PyTorchJob or RayJob, not {self.task_type!r}")


def run(args: RunArgs, defaults: RunDefaults) -> Streaming[LogLine, RunResult]:
    me = yield from get_json("/api/v1/whoami")
    cat = yield from get_json("/api/v1/catalog")
    choice = choose(
        group=args.group,
        pool=args.pool,
        spec=args.spec,
        image=args.image,
        resource_type=args.resource_type,
        gpus=args.gpus,
        ray=args.task_type == "RayJob",
        defaults=defaults,
        me=me if isinstance(me, dict) else {},
        cat=cat if isinstance(cat, dict) else {},
    )
    doc = document(
        choice,
        args.cmd,
        task_type=args.task_type,
        workers=args.workers,
        name_prefix=args.name_prefix,
        max_resubmissions=args.max_resubmissions,
    )
    workdir_id = None
    if args.workdir is not None:
        workdir_id = yield from _workdir.upload(args.workdir, choice.group)
        doc["spec"]["environment"]["workdir"] = workdir_id
    task = yield from submit_json(json.dumps(doc).encode(), None)
    if args.detach:
        return RunResult(task=task, status=task.status, exit_code=None, message="", workdir=workdir_id)
    if not args.follow:
        current = yield from get_by_id(task.id)
        while not current.is_terminal:
            yield from sleep(_START_LOOK_S)
            current = yield from get_by_id(task.id)
        return (yield from _result(current, workdir_id))
    # Each attempt's output in turn, to the end of its replicas (an attempt that never started is passed
    # over); then the task has ended, or a resubmitted attempt is next.
    attempt = 0
    while True:
        names = yield from _wait_for_attempt(task.id, attempt)
        if names:
            yield from _follow_attempt(task.id, attempt, names)
        current = yield from get_by_id(task.id)
        while current.attempt <= attempt and not current.is_terminal:
            yield from sleep(_BETWEEN_ATTEMPTS_S)
            current = yield from get_by_id(task.id)
        if current.attempt > attempt:
            attempt += 1
            continue
        return (yield from _result(current, workdir_id))


def _wait_for_attempt(task_id: str, attempt: int) -> Plan[list[str] | None]:
    """Waits until ``attempt`` has replicas: their names. ``None`` when it never will (the task ended first,
    or went on to a later attempt)."""
    while True:
        current = yield from get_by_id(task_id)
        for a in (yield from _logs.replicas(current)):
            if a.attempt == attempt and a.replicas:
                return [r.name for r in a.replicas]
        if current.is_terminal or current.attempt > attempt:
            return None
        yield from sleep(_START_LOOK_S)


def _follow_attempt(task_id: str, attempt: int, replicas: list[str]) -> Streaming[LogLine, None]:
    """Every replica's output of the attempt: what each has written, then all followed at once, each to its
    end."""
    follows = []
    for name in replicas:
        lines, at = yield from _logs.read_now(task_id, name, attempt, True)
        for line in lines:
            yield Emit(line)
        follows.append(_logs.stream(task_id, name, attempt, at))
    yield Merge(follows)


def _result(task: Task, workdir_id: str | None) -> Plan[RunResult]:
    evs = yield from events(task, 0)
    message = evs[-1].message if evs else ""
    if task.status is Status.SUCCEEDED:
        code = 0
    elif task.status is Status.STOPPED:
        code = EXIT_STOPPED
    else:
        stated = next(
            (c for e in evs if e.attempt == task.attempt if (c := exit_code_in(e.message)) not in (None, 0)), None
        )
        code = min(max(stated, 1), 255) if stated is not None else EXIT_FAILED
    assert task.status in TERMINAL_STATUSES, f"a run's result is of an ended task, not {task.status}"
    return RunResult(task=task, status=task.status, exit_code=code, message=message, workdir=workdir_id)
