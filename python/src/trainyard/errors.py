"""The errors the client raises.

Every error is a :class:`TrainyardError`. A refusal from the server is a :class:`ProblemError` built from the
RFC 9457 problem document it answered with (``application/problem+json``); its subclass says which kind
(``NotFound``, ``ValidationError``, ...). A server that cannot be reached is a
:class:`TrainyardConnectionError`, and :meth:`trainyard.Client.wait` giving up is a :class:`WaitTimeout`.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

# FieldProblem lives beside both this module and models (a 422's problems and a validation's), so that models
# need not import errors while errors names models' Task; it is re-exported here, where it always was.
from ._problems import FieldProblem

if TYPE_CHECKING:
    from .models import Task

__all__ = [
    "AccountDisabled",
    "BadRequest",
    "Conflict",
    "FieldProblem",
    "Forbidden",
    "NotFound",
    "PayloadTooLarge",
    "ProblemError",
    "ServerError",
    "TrainyardConnectionError",
    "TrainyardError",
    "Unauthorized",
    "UnexpectedResponse",
    "UsageError",
    "ValidationError",
    "WaitTimeout",
    "WorkdirError",
]

PROBLEM_TYPE_PREFIX = "https://trainyard.dev/problems/"


class TrainyardError(Exception):
    """The base of every error this package raises."""


class TrainyardConnectionError(TrainyardError, ConnectionError):
    """The server could not be reached, or the connection broke or timed out mid-answer."""

    def __init__(self, message: str, *, url: str) -> None:
        super().__init__(message)
        self.url = url


class UnexpectedResponse(TrainyardError):
    """The server answered with success but with a body this client cannot read."""


class WaitTimeout(TrainyardError, TimeoutError):
    """:meth:`trainyard.Client.wait` gave up before the task reached a status it waited for.

    ``task`` is the task as last seen.
    """

    def __init__(self, message: str, *, task: Task) -> None:
        super().__init__(message)
        self.task = task


class UsageError(TrainyardError, ValueError):
    """What was asked cannot be done as asked, found before anything was sent: a task document
    :meth:`trainyard.Client.submit` cannot put a working directory in, or what :meth:`trainyard.Client.run`
    should run on not found in the catalog."""


class WorkdirError(UsageError):
    """A working directory that cannot be sent as it is; nothing was sent. ``problems`` names every one (a
    link that leads out of the directory, a special file, a name that is not UTF-8, ...), each as
    ``path: what``; ``path`` is the directory."""

    def __init__(self, path: str | os.PathLike[str], problems: list[str]) -> None:
        self.path = os.fspath(path)
        self.problems = list(problems)
        n = len(self.problems)
        things = "one thing" if n == 1 else f"{n} things"
        super().__init__(
            f"working directory {self.path}: nothing was sent, {things} to mend first:\n  " + "\n  ".join(problems)
        )


class ProblemError(TrainyardError):
    """The server refused a request; the fields are those of its problem document."""

    status: int
    """The HTTP status."""
    type: str
    """The problem type, a URI ending in a stable code (``https://trainyard.dev/problems/not-found``)."""
    title: str
    detail: str
    problems: list[FieldProblem]
    """A refused task document's problems, each with its field path (empty for other refusals)."""
    method: str
    url: str

    def __init__(
        self,
        *,
        status: int,
        type: str,  # noqa: A002 - the problem document's own name
        title: str,
        detail: str,
        problems: list[FieldProblem] | None = None,
        method: str = "",
        url: str = "",
        body: Any = None,
    ) -> None:
        self.status = status
        self.type = type
        self.title = title
        self.detail = detail
        self.problems = list(problems or [])
        self.method = method
        self.url = url
        self.body = body
        super().__init__(self._message())

    @property
    def code(self) -> str:
        """The stable code the type ends in (``not-found``, ``invalid-task``, ``conflict``, ...)."""
        return self.type.rstrip("/").rsplit("/", 1)[-1]

    def _message(self) -> str:
        text = f"{self.title} ({self.status}): {self.detail}"
        for p in self.problems:
            text += f"\n  {p.severity}[{p.code}] {p.path}: {p.message}"
        return text

    @classmethod
    def from_response(cls, status: int, text: str, *, method: str = "", url: str = "") -> ProblemError:
        """The error for an answer with an error status: its problem document, else what it said."""
        body: Any
        try:
            body = json.loads(text) if text else None
        except ValueError:
            body = None
        if isinstance(body, dict) and ("type" in body or "title" in body):
            raw = body.get("problems")
            problems = [FieldProblem.from_json(p) for p in raw if isinstance(p, dict)] if isinstance(raw, list) else []
            st = body.get("status")
            problem_status = st if isinstance(st, int) else status
            kind = _class_for(status, str(body.get("type", "")))
            return kind(
                status=problem_status,
                type=str(body.get("type", "about:blank")),
                title=str(body.get("title", "")),
                detail=str(body.get("detail", "")),
                problems=problems,
                method=method,
                url=url,
                body=body,
            )
        # Not a problem document (a proxy in front of the server, say): what it said, as the detail.
        kind = _class_for(status, "")
        return kind(
            status=status,
            type="about:blank",
            title=_REASONS.get(status, "HTTP error"),
            detail=text.strip()[:2000],
            method=method,
            url=url,
            body=body if body is not None else text,
        )


class BadRequest(ProblemError):
    """400: a query or body that does not parse, or a value out of bounds (``bad-request``)."""


class Unauthorized(ProblemError):
    """401: no token, or an unknown or revoked one."""


class Forbidden(ProblemError):
    """403: the caller's role, group or rights do not allow it."""


class AccountDisabled(Forbidden):
    """403 ``account-disabled``: the token is good, but its user is disabled."""


class NotFound(ProblemError):
    """404: no such task (or one the caller may not see), replica, user, ..."""


class Conflict(ProblemError):
    """409: not in the task's current status, or an ``Idempotency-Key`` used for another document."""


class PayloadTooLarge(ProblemError):
    """413: the body is over the server's limit."""


class ValidationError(ProblemError):
    """422: the task document has problems; :attr:`problems` lists every one with its field path."""

    @property
    def errors(self) -> list[FieldProblem]:
        """The problems that block the task (severity ``error``)."""
        return [p for p in self.problems if p.severity == "error"]

    @property
    def paths(self) -> list[str]:
        """The field path of every problem, in the server's order."""
        return [p.path for p in self.problems]

    def by_path(self) -> dict[str, list[FieldProblem]]:
        """The problems grouped by field path."""
        out: dict[str, list[FieldProblem]] = {}
        for p in self.problems:
            out.setdefault(p.path, []).append(p)
        return out


class ServerError(ProblemError):
    """5xx: the server failed."""


_BY_STATUS: dict[int, type[ProblemError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    422: ValidationError,
}

_REASONS = {
    400: "Bad request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not found",
    409: "Conflict",
    413: "Payload too large",
    422: "Unprocessable content",
    500: "Internal server error",
    502: "Bad gateway",
    503: "Service unavailable",
    504: "Gateway timeout",
}


def _class_for(status: int, problem_type: str) -> type[ProblemError]:
    if problem_type == PROBLEM_TYPE_PREFIX + "account-disabled":
        return AccountDisabled
    if status >= 500:
        return ServerError
    return _BY_STATUS.get(status, ProblemError)
