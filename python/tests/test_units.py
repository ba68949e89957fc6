"""The pieces that need no server: the event-stream reader, log lines, problem documents, and both clients over
an injected transport (``httpx.MockTransport``)."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import tarfile
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

import trainyard
from trainyard import LogLine, NotFound, ProblemError, ServerError, Status, ValidationError
from trainyard._sse import events, split_lines
from trainyard._ignore import IgnoreFile, Match
from trainyard._run import Choice, RunDefaults, choose, command_line, exit_code_in
from trainyard._tasks import _document
from trainyard._workdir import Entry, manifest_id, pack


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


# --- queue holders ----------------------------------------------------------------------------------------


def test_a_queued_tasks_view_names_what_holds_its_room() -> None:
    holder = {
        "id": "t1",
        "name": "big-ab12c",
        "owner": "ann",
        "projectGroup": "nlp",
        "spendsItsQuota": True,
        "units": 4,
        "spec": "gpu.1",
        "runningSinceMs": 1796172278995,
        "stopping": False,
    }
    q = trainyard.QueuePosition.from_json(
        {"position": 2, "positionInGroup": 1, "reason": "quota", "holders": [holder], "moreHolders": 3}
    )
    assert q.more_holders == 3 and q.holders is not None
    [h] = q.holders
    assert (h.id, h.name, h.owner, h.project_group, h.spends_its_quota, h.units, h.spec, h.stopping) == (
        "t1",
        "big-ab12c",
        "ann",
        "nlp",
        True,
        4,
        "gpu.1",
        False,
    )
    assert h.running_since == CREATED and h.running_since.tzinfo is UTC
    # Lists have neither.
    listed = trainyard.QueuePosition.from_json({"position": 2, "positionInGroup": 1, "reason": "quota"})
    assert (listed.holders, listed.more_holders) == (None, None)
    queue = {"position": 1, "positionInGroup": 1, "reason": "r", "holders": [], "moreHolders": 0}
    task = trainyard.Task.from_json({**TASK, "status": "Queued", "queue": queue})
    assert task.queue is not None and (task.queue.holders, task.queue.more_holders) == ([], 0)


# --- ignore rules, run's choices --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lines", "path", "is_dir", "ignored"),
    [
        ("*.log", "a.log", False, True),
        ("*.log", "sub/deep/a.log", False, True),
        ("*.log\n!keep.log", "keep.log", False, False),
        ("/a.log", "sub/a.log", False, False),
        ("/a.log", "a.log", False, True),
        ("out/", "out", True, True),
        ("out/", "out", False, False),  # a file (or a link) named like an ignored directory
        ("a/b", "x/a/b", False, False),  # an inner slash anchors it
        ("a/**", "a", True, False),
        ("a/**", "a/b/c", False, True),
        ("**/sub", "x/y/sub", True, True),
        ("a/**/b", "a/b", False, True),
        ("a/**/b", "a/x/y/b", False, True),
        ("*", "a/b", False, True),
        ("?.py", "ab.py", False, False),
        ("[!a]*", "b", False, True),
        ("[!a]*", "a", False, False),
        ("[[:digit:]]x", "1x", False, True),
        ("\\#c", "#c", False, True),
        ("#c", "#c", False, False),  # a comment
        ("a\\ ", "a ", False, True),  # an escaped trailing space stays
        ("a  ", "a", False, True),  # the others go
        ("*.{py,txt}", "a.txt", False, True),  # the CLI's alternation (git would read the braces literally)
        ("}", "}", False, False),  # no glob: skipped, as the CLI skips it
        ("!", "!", False, False),
    ],
)
def test_ignore_lines(lines: str, path: str, is_dir: bool, ignored: bool) -> None:
    f = IgnoreFile.parse(lines.encode())
    assert (f.match(path.encode(), is_dir) is Match.IGNORE) is ignored


def test_ignore_files_above_count_within_the_repository_only(tmp_path: Path) -> None:
    """As the CLI's ``rules.rs`` test: a home directory's ``*`` leaves nothing out, the repository's own
    ``.gitignore`` and ``info/exclude`` do, and a ``.trainyardignore`` may keep what they leave out."""
    home = tmp_path / "home"
    repo, proj = home / "repo", home / "repo" / "proj"
    (repo / ".git" / "info").mkdir(parents=True)
    proj.mkdir()
    (home / ".gitignore").write_text("*\n")
    (repo / ".gitignore").write_text("*.log\n")
    (repo / ".git" / "info" / "exclude").write_text("secret\n")
    for f in ("train.py", "a.log", "keep.log", "secret"):
        (proj / f).write_text(f)
    (proj / ".trainyardignore").write_text("!keep.log\n")

    def paths(d: Path) -> list[str]:
        return [e.path for e in pack(d).entries]

    assert paths(proj) == [".trainyardignore", "keep.log", "train.py"]
    loose = home / "loose"
    loose.mkdir()
    (loose / "train.py").write_text("x")
    assert paths(loose) == ["train.py"]
    top = paths(repo)
    assert "proj/train.py" in top and "proj/a.log" not in top, top


def test_commands_are_words_and_exit_codes_are_read_back() -> None:
    assert command_line(["python3", "-c", "print(42)", "it's", ""]) == "python3 -c 'print(42)' 'it'\\''s' ''"
    assert command_line("echo $HOME | wc") == "echo $HOME | wc"
    assert exit_code_in("run-master-0 exited with code 3: ValueError") == 3
    assert exit_code_in("killed by signal 9") is None


CATALOG = {
    "clusters": {"local": {"region": "local"}},
    "pools": {"default": {"cluster": "local", "instanceSpecs": ["gpu.1", "cpu.small"]}},
    "instanceSpecs": {"gpu.1": {"gpus": 1}, "cpu.small": {"gpus": 0}, "gpu.8": {"gpus": 8}},
    "projectGroups": {"default": {}, "nlp": {}},
    "images": {"host": {"projectGroups": ["default"]}, "torch": {}, "ray": {"ray": True}},
    "quotas": [
        {"group": "default", "resourceType": "Reserved", "pool": "default", "spec": "gpu.1", "units": 4},
        {"group": "default", "resourceType": "Reserved", "pool": "default", "spec": "cpu.small", "units": 4},
        {"group": "nlp", "resourceType": "Spot", "pool": "default", "spec": "gpu.8", "units": 1},
    ],
}


def test_the_first_fit_is_chosen_from_the_catalog_as_the_cli_chooses() -> None:
    me = {"role": "member", "groups": ["default"]}

    def pick(defaults: RunDefaults = RunDefaults(), **asked: Any) -> Choice:
        args: dict[str, Any] = {"group": None, "pool": None, "spec": None, "image": None, "resource_type": None}
        args |= {"gpus": 0, "ray": False} | asked
        return choose(defaults=defaults, me=me, cat=CATALOG, **args)

    c = pick()
    assert (c.spec, c.image, c.region, c.cluster) == ("cpu.small", "host", "local", "local")
    assert pick(gpus=1).spec == "gpu.1"
    assert pick(ray=True).image == "ray"
    # Another group: no host image (not offered to it), and only GPUs.
    c = pick(group="nlp", gpus=2)
    assert (c.spec, c.resource_type, c.image) == ("gpu.8", "Spot", "ray")
    has = r"no quota that fits a CPU-only replica; it has: Spot default gpu.8 \(8 GPUs\)"
    with pytest.raises(trainyard.UsageError, match=has):
        pick(group="nlp")
    # The config file's defaults count when the arguments say nothing.
    c = pick(RunDefaults(spec="gpu.1", image="torch"))
    assert (c.spec, c.image) == ("gpu.1", "torch")
    assert RunDefaults.from_config({"resourceType": "Spot"}, "c.yaml") == RunDefaults(resource_type="Spot")
    with pytest.raises(trainyard.UsageError, match="defaults: has no gpus"):
        RunDefaults.from_config({"gpus": 1}, "c.yaml")


# --- a working directory's upload, over a mock transport --------------------------------------------------


def test_an_upload_checks_sends_what_is_missing_and_commits(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("A = 1\n")
    (tmp_path / "b.txt").write_text("b\n")
    packed = pack(tmp_path)
    digest_a = next(e.sha256 for e in packed.entries if e.path == "a.py")
    seen: list[str] = []

    def server(held: bool) -> Callable[[httpx.Request], httpx.Response]:
        def answer(request: httpx.Request) -> httpx.Response:
            seen.append(request.url.path)
            body = json.loads(request.content) if request.url.path != "/api/v1/workdirs/blobs" else None
            if request.url.path == "/api/v1/workdirs/check":
                assert body is not None and body["projectGroup"] == "g"
                assert body["manifest"]["entries"] == [e.to_json() for e in packed.entries]
                if held:
                    held_all = {"id": packed.id, "missing": [], "missingBytes": 0, "bytes": 8}
                    return httpx.Response(200, json=held_all | {"workdir": {"id": packed.id}})
                return httpx.Response(200, json={"id": packed.id, "missing": [digest_a], "missingBytes": 6, "bytes": 8})
            if request.url.path == "/api/v1/workdirs/blobs":
                assert request.url.params["projectGroup"] == "g"
                with tarfile.open(fileobj=io.BytesIO(request.content)) as tar:
                    [member] = tar.getmembers()
                    assert member.name == digest_a and member.isfile()
                    assert tar.extractfile(member).read() == b"A = 1\n"  # type: ignore[union-attr]
                return httpx.Response(200, json={"files": 1, "bytes": 6})
            assert request.url.path == "/api/v1/workdirs"
            return httpx.Response(201, json={"id": packed.id})

        return answer

    with trainyard.Client("http://ty.test", "t", transport=httpx.MockTransport(server(False))) as c:
        assert c.upload_workdir(tmp_path, "g") == packed.id
    assert seen == ["/api/v1/workdirs/check", "/api/v1/workdirs/blobs", "/api/v1/workdirs"]
    seen.clear()

    async def again() -> str:
        async with trainyard.AsyncClient("http://ty.test", "t", transport=httpx.MockTransport(server(True))) as c:
            return await c.upload_workdir(tmp_path, "g")

    assert asyncio.run(again()) == packed.id
    assert seen == ["/api/v1/workdirs/check"]  # the server held it all: kept at the check


def test_a_manifests_id_is_the_digest_of_its_entries_in_path_order() -> None:
    a = Entry("b", "file", sha256="a" * 64, size=3)
    b = Entry("a/x", "link", target="../b")
    c = Entry("a", "dir")
    text = '[{"path":"a","kind":"dir"},{"path":"a/x","kind":"link","target":"../b"},' + (
        '{"path":"b","kind":"file","sha256":"' + "a" * 64 + '","size":3}]'
    )
    assert manifest_id([a, b, c]) == manifest_id([c, b, a]) == hashlib.sha256(text.encode()).hexdigest()
