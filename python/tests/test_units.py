"""The pieces that need no server: the event-stream reader, log lines, problem documents, and both clients over
an injected transport (``httpx.MockTransport``)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import httpx
import pytest

import trainyard
from trainyard import LogLine, NotFound, ProblemError, ServerError, Status, ValidationError
from trainyard._sse import events, split_lines
from trainyard._tasks import _document


def test_lines_split_on_crlf_lf_and_cr_across_chunks() -> None:
    chunks = [b"data: a\r", b"\ndata: b\rdata: c\n", b"\n: keep-alive\n\nevent: end\ndata: x", b"\n\n"]
    lines = list(split_lines(chunks))
    assert lines == ["data: a", "data: b", "data: c", "", ": keep-alive", "", "event: end", "data: x", ""]
    evs = list(events(lines))
    assert [(e.event, e.data) for e in evs] == [("message", ["a", "b", "c"]), ("end", ["x"])]


def test_form_feeds_and_unicode_separators_are_not_line_breaks() -> None:
    assert list(split_lines(["a\x0cb\u2028c\n".encode()])) == ["a\x0cb\u2028c"]


def test_an_event_cut_short_is_not_dispatched() -> None:
    assert [e.data for e in events(["data: whole", "", "data: cut"])] == [["whole"]]


def test_log_lines_in_the_stored_form_and_not() -> None:
    line = LogLine.parse("2026-12-02T00:44:38.995Z E loss 0.25 at step 3", replica="r", attempt=2)
    assert (line.time, line.stream, line.text, str(line)) == (
        datetime(2026, 12, 2, 0, 44, 38, 995000, tzinfo=UTC),
        "E",
        "loss 0.25 at step 3",
        "loss 0.25 at step 3",
    )
    assert line.time is not None and line.time.tzinfo is UTC
    odd = LogLine.parse("just text", replica="r", attempt=0)
    assert (odd.time, odd.stream, odd.text) == (None, "", "just text")
    # A time with an offset is read in UTC; a first word that only looks like one leaves the line as text.
    shifted = LogLine.parse("2026-12-02T01:44:38+01:00 O x", replica="r", attempt=0)
    assert shifted.time == datetime(2026, 12, 2, 0, 44, 38, tzinfo=UTC) and shifted.time.tzinfo is UTC
    assert LogLine.parse("2026-99-99T00:00:00Z O x", replica="r", attempt=0).text == "2026-99-99T00:00:00Z O x"
    empty = LogLine.parse("2026-12-02T00:44:38.995Z O ", replica="r", attempt=0)
    assert empty.text == ""


def test_problem_documents_and_other_error_bodies() -> None:
    e = ProblemError.from_response(
        422,
        '{"type":"https://trainyard.dev/problems/invalid-task","title":"T","status":422,"detail":"d",'
        '"problems":[{"path":"a.b","code":"required","severity":"error","message":"m"}]}',
    )
    assert isinstance(e, ValidationError) and e.paths == ["a.b"] and e.code == "invalid-task"
    proxy = ProblemError.from_response(502, "<html>bad gateway</html>")
    assert isinstance(proxy, ServerError) and proxy.status == 502 and "bad gateway" in proxy.detail
    assert isinstance(ProblemError.from_response(404, ""), NotFound)


def test_status_names_in_any_case() -> None:
    assert Status.parse("running") is Status.RUNNING and Status.parse("STOPPED").is_terminal
    status: Status = Status.parse("Running")
    assert status == "Running" and f"{status}" == "Running"


def test_documents_in_every_form() -> None:
    assert _document({"a": 1}) == (b'{"a": 1}', "application/json")
    assert _document("a: 1\n") == (b"a: 1\n", "application/yaml")
    assert _document(b"{}") == (b"{}", "application/yaml")


# --- both clients over a mock transport -------------------------------------------------------------------

CREATED = datetime(2026, 12, 2, 0, 44, 38, 995000, tzinfo=UTC)
NAME = "mock-ab12c"
TASK = {
    "id": "0123456789abcdef",
    "name": NAME,
    "owner": "admin",
    "projectGroup": "default",
    "type": "PyTorchJob",
    "status": "Succeeded",
    "public": False,
    "attempt": 0,
    "retries": 0,
    "createdAtMs": 1796172278995,
    "updatedAtMs": 1796172280000,
    "statusSinceMs": 1796172280000,
    "runStartedAtMs": 1796172279000,
}
REPLICA = "mock-ab12c-master-0"
STREAM = (
    f"data: 2026-12-02T00:44:39.500Z O second\n\n: keep-alive\n\ndata: 2026-12-02T00:44:40Z E third\n\n"
    "event: end\ndata: exited 0\n\n"
)


def mock_server(request: httpx.Request) -> httpx.Response:
    """A few of the server's answers: a task found by name, its log (read, then followed), and a failing
    whoami behind a proxy (503 with a problem document) or no server at all."""
    path, q = request.url.path, request.url.params
    assert request.headers["authorization"] == "Bearer ty_mock"
    if path == "/api/v1/tasks":  # a name lookup
        return httpx.Response(200, json={"items": [TASK] if q.get("q") == NAME else [], "nextCursor": None})
    if path == f"/api/v1/tasks/{TASK['id']}":
        return httpx.Response(200, json=TASK)
    if path == f"/api/v1/tasks/{TASK['id']}/logs":
        if "replica" not in q:
            attempts = [{"attempt": 0, "replicas": [{"name": REPLICA, "role": "master"}]}]
            return httpx.Response(200, json={"items": attempts})
        if q.get("follow") == "true":
            assert (q["offset"], request.headers["accept"]) == ("33", "text/event-stream")
            return httpx.Response(200, content=STREAM.encode(), headers={"Content-Type": "text/event-stream"})
        body = b"2026-12-02T00:44:38.995Z O first\n" if q["offset"] == "0" else b""
        return httpx.Response(200, content=body, headers={"X-Next-Offset": str(int(q["offset"]) + len(body))})
    if path == "/api/v1/whoami":
        problem = {"type": "about:blank", "title": "Service unavailable", "status": 503, "detail": "draining"}
        return httpx.Response(503, content=json.dumps(problem), headers={"Content-Type": "application/problem+json"})
    if path == "/api/v1/quota":
        raise httpx.ConnectError("connection refused", request=request)
    return httpx.Response(404, json={"type": "https://trainyard.dev/problems/not-found", "title": "Not found"})


def check_task(task: trainyard.Task) -> None:
    assert (task.id, task.status) == (TASK["id"], Status.SUCCEEDED)
    assert task.created_at == CREATED and task.created_at.tzinfo is UTC
    assert task.run_started_at is not None and task.run_started_at < task.status_since == task.updated_at


def check_lines(lines: list[LogLine]) -> None:
    assert [(x.text, x.stream, x.replica) for x in lines] == [
        ("first", "O", REPLICA),
        ("second", "O", REPLICA),
        ("third", "E", REPLICA),
    ]
    assert [x.time for x in lines] == [
        CREATED,
        datetime(2026, 12, 2, 0, 44, 39, 500000, tzinfo=UTC),
        datetime(2026, 12, 2, 0, 44, 40, tzinfo=UTC),
    ]


def test_the_client_over_an_injected_transport() -> None:
    with trainyard.Client("http://ty.test", "ty_mock", transport=httpx.MockTransport(mock_server)) as c:
        check_task(c.get(NAME))
        check_lines(list(c.logs(NAME, follow=True)))
        with pytest.raises(ServerError) as refused:
            c.whoami()
        assert (refused.value.status, refused.value.detail) == (503, "draining")
        with pytest.raises(NotFound, match="no task named 'no-such-task'"):
            c.get("no-such-task")
        with pytest.raises(trainyard.TrainyardConnectionError, match="cannot reach http://ty.test"):
            c.request("GET", "/api/v1/quota")


def test_the_async_client_over_an_injected_transport() -> None:
    async def go() -> None:
        transport = httpx.MockTransport(mock_server)
        async with trainyard.AsyncClient("http://ty.test", "ty_mock", transport=transport) as c:
            check_task(await c.get(NAME))
            check_lines([line async for line in c.logs(NAME, follow=True)])
            with pytest.raises(ServerError) as refused:
                await c.whoami()
            assert (refused.value.status, refused.value.detail) == (503, "draining")
            with pytest.raises(NotFound, match="no task named 'no-such-task'"):
                await c.get("no-such-task")
            with pytest.raises(trainyard.TrainyardConnectionError, match="cannot reach http://ty.test"):
                await c.request("GET", "/api/v1/quota")

    asyncio.run(go())


def test_times_are_aware() -> None:
    from trainyard.models import _to_ms

    assert _to_ms(CREATED) == TASK["createdAtMs"]
    with pytest.raises(ValueError, match="time zone"):
        _to_ms(datetime(2026, 12, 2))
