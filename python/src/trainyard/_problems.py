"""One problem at one field of a task document: what a 422 ``invalid-task`` lists and what a validation answers.

It is its own module because both :mod:`trainyard.errors` and :mod:`trainyard.models` use it, and errors already
names models' ``Task``: either importing the other for it would make an import circle. The public names are
``trainyard.FieldProblem`` and ``trainyard.errors.FieldProblem``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class FieldProblem:
    """One problem at one field of a task document (a 422 ``invalid-task`` lists every one)."""

    path: str
    """Where, from the document's root: ``spec.environment.env[2].name``; empty for the whole document."""
    code: str
    """A stable code: ``required``, ``invalid-name``, ``not-found``, ``out-of-range``, ..."""
    severity: str
    """``error`` (blocks the task) or ``warning``."""
    message: str
    """What is wrong and what to change."""

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> FieldProblem:
        return cls(
            path=str(d.get("path", "")),
            code=str(d.get("code", "")),
            severity=str(d.get("severity", "error")),
            message=str(d.get("message", "")),
        )

    def __str__(self) -> str:
        return f"{self.path or '<document>'}: {self.message} [{self.code}]"
