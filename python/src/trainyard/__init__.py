"""Trainyard's Python client: submit, watch and manage training tasks on a Trainyard server.

>>> import trainyard
>>> with trainyard.Client.from_env() as c:
...     task = c.wait(c.submit("examples/local/hello.yaml"))
...     for line in c.logs(task):
...         print(line)

:class:`AsyncClient` has the same methods, to await (``async for`` a log).
"""

from .client import DEFAULT_SERVER, AsyncClient, Client, SpecLike, TaskRef, __version__
from .errors import (
    AccountDisabled,
    BadRequest,
    Conflict,
    FieldProblem,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    ProblemError,
    ServerError,
    TrainyardConnectionError,
    TrainyardError,
    Unauthorized,
    UnexpectedResponse,
    ValidationError,
    WaitTimeout,
)
from .models import (
    TERMINAL_STATUSES,
    Admission,
    AttemptReplicas,
    BulkDeleted,
    Event,
    LogLine,
    MetricSeries,
    Metrics,
    Page,
    Placement,
    PlacementReplica,
    QueuePosition,
    StartingWait,
    Replica,
    ReplicaShape,
    Share,
    Status,
    Task,
    TaskDemand,
    User,
    Validation,
)

__all__ = [
    "DEFAULT_SERVER",
    "TERMINAL_STATUSES",
    "AccountDisabled",
    "Admission",
    "AsyncClient",
    "AttemptReplicas",
    "BadRequest",
    "BulkDeleted",
    "Client",
    "Conflict",
    "Event",
    "FieldProblem",
    "Forbidden",
    "LogLine",
    "MetricSeries",
    "Metrics",
    "NotFound",
    "Page",
    "PayloadTooLarge",
    "Placement",
    "PlacementReplica",
    "ProblemError",
    "QueuePosition",
    "StartingWait",
    "Replica",
    "ReplicaShape",
    "ServerError",
    "Share",
    "SpecLike",
    "Status",
    "Task",
    "TaskDemand",
    "TaskRef",
    "TrainyardConnectionError",
    "TrainyardError",
    "Unauthorized",
    "UnexpectedResponse",
    "User",
    "Validation",
    "ValidationError",
    "WaitTimeout",
    "__version__",
]
