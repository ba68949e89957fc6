"""The pieces that need no server: the event-stream reader, log lines and problem documents."""

from __future__ import annotations

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
        "2026-12-02T00:44:38.995Z",
        "E",
        "loss 0.25 at step 3",
        "loss 0.25 at step 3",
    )
    assert line.timestamp is not None and line.timestamp.year == 2026
    odd = LogLine.parse("just text", replica="r", attempt=0)
    assert (odd.time, odd.stream, odd.text, odd.timestamp) == ("", "", "just text", None)
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
