"""The connection to a server: the HTTP session with the token, and the requests every call goes through
(refusals raised as problems, answers read as JSON)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import httpx

from .errors import ProblemError, TrainyardConnectionError, UnexpectedResponse

__version__ = "0.1.0"

DEFAULT_SERVER = "http://127.0.0.1:8080"

_R = TypeVar("_R")


class _Transport:
    """One server, as one user (the token's): the session the :class:`~trainyard.Client`'s calls share."""

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

    # --- the connection ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Closes the connections; the client cannot be used after."""
        self._http.close()

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
