"""The client: one object per server and token, over the server's HTTP API (``/api/v1``)."""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from ._logs import _Logs
from ._tasks import SpecLike, TaskRef
from ._transport import DEFAULT_SERVER, _build
from ._transport import __version__ as __version__
from .errors import TrainyardError
from .models import User

__all__ = ["DEFAULT_SERVER", "Client", "SpecLike", "TaskRef"]


class Client(_Logs):
    """A Trainyard server, as one user (the token's).

    >>> with Client("http://127.0.0.1:8080", token) as c:
    ...     task = c.submit(Path("examples/local/hello.yaml"))
    ...     task = c.wait(task)

    Every method that names a task takes its name, its id or a :class:`Task`. A refusal raises a
    :class:`~trainyard.errors.ProblemError` subclass; an unreachable server a
    :class:`~trainyard.errors.TrainyardConnectionError`.
    """

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

    # --- the caller -------------------------------------------------------------------------------------

    def whoami(self) -> User:
        """The token's user: name, role and project groups."""
        return _build(User.from_json, self._get("/api/v1/whoami"))
