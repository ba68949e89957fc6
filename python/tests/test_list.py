"""Finding tasks: by name and by id, filters, sorting and pages."""

from __future__ import annotations

from datetime import UTC

import pytest

import trainyard
from helpers import task_doc, unique


@pytest.fixture(scope="module")
def three(client: trainyard.Client) -> tuple[str, list[trainyard.Task]]:
    """Three ended tasks under one prefix: two labelled team=a, one team=b."""
    prefix = unique("lst")
    tasks = [
        client.submit(task_doc(prefix, f"echo {i}", labels={"team": team}))
        for i, team in enumerate(["a", "a", "b"])
    ]
    return prefix, [client.wait(t, timeout=60, poll=0.2) for t in tasks]


def test_get_by_name_and_by_id(client: trainyard.Client, three: tuple[str, list[trainyard.Task]]) -> None:
    _, tasks = three
    t = tasks[0]
    by_name = client.get(t.name)
    by_id = client.get(t.id)
    assert by_name.id == by_id.id == t.id
    assert by_name.status is trainyard.Status.SUCCEEDED
    assert by_name.spec is not None  # a get has the spec; a list does not
    assert by_name.labels == {"team": "a"}
    assert client.resolve(t.name) == client.resolve(t.id) == t.id
    assert client.resolve(t) == t.id


def test_list_with_filters(client: trainyard.Client, three: tuple[str, list[trainyard.Task]]) -> None:
    prefix, tasks = three
    page = client.list(search=prefix)
    assert {t.id for t in page} == {t.id for t in tasks}
    assert page.next_cursor is None
    assert all(t.spec is None for t in page)
    # The newest first by default.
    assert [t.created_at for t in page] == sorted((t.created_at for t in page), reverse=True)

    exact = client.list(search=tasks[1].name)
    assert [t.id for t in exact] == [tasks[1].id]
    by_id = client.list(search=tasks[2].id)
    assert [t.id for t in by_id] == [tasks[2].id]

    assert len(client.list(search=prefix, status="succeeded")) == 3  # any case
    assert len(client.list(search=prefix, status=trainyard.Status.RUNNING)) == 0
    assert len(client.list(search=prefix, group="default", owner="admin", task_type="PyTorchJob")) == 3
    assert len(client.list(search=prefix, group="no-such-group")) == 0
    assert len(client.list(search=prefix, group="no-such-group,default")) == 3  # any of several
    # The test server's catalog has no GPUs: these are CPU tasks.
    assert len(client.list(search=prefix, accelerator="cpu")) == 3
    assert len(client.list(search=prefix, accelerator="gpu")) == 0
    # What each asked for (one replica of the test catalog's CPU spec) and how long it ran.
    for t in page:
        assert t.demand is not None and t.demand.accelerator == "cpu", t.demand
        assert [(s.replicas, s.gpus) for s in t.demand.shapes] == [(1, 0)], t.demand
        assert t.run_started_at is not None and t.created_at <= t.run_started_at <= t.status_since
        assert t.created_at.tzinfo is UTC
    assert len(client.list_all(search=prefix, accelerator="cpu", page_size=1)) == 3
    with pytest.raises(trainyard.BadRequest, match="gpu, cpu"):
        client.list(accelerator="tpu")  # type: ignore[arg-type]
    assert {t.id for t in client.list(search=prefix, labels={"team": "a"})} == {tasks[0].id, tasks[1].id}
    assert [t.id for t in client.list(search=prefix, labels="team=b")] == [tasks[2].id]

    by_name = client.list(search=prefix, sort="name")
    assert [t.name for t in by_name] == sorted(t.name for t in tasks)
    assert [t.id for t in client.list(search=prefix, sort="oldest")] == [t.id for t in tasks]

    with pytest.raises(ValueError):
        client.list(status="bogus")


def test_pages_and_iteration(client: trainyard.Client, three: tuple[str, list[trainyard.Task]]) -> None:
    prefix, tasks = three
    first = client.list(search=prefix, limit=2, sort="oldest")
    assert [t.id for t in first] == [tasks[0].id, tasks[1].id]
    assert first.next_cursor
    second = client.list(search=prefix, limit=2, sort="oldest", cursor=first.next_cursor)
    assert [t.id for t in second] == [tasks[2].id]
    assert second.next_cursor is None

    assert [t.id for t in client.iter_tasks(search=prefix, sort="oldest", page_size=1)] == [t.id for t in tasks]
    assert {t.id for t in client.list_all(search=prefix, page_size=2)} == {t.id for t in tasks}
    everything = client.list_all(page_size=500)
    assert {t.id for t in tasks} <= {t.id for t in everything}

    with pytest.raises(trainyard.BadRequest) as refused:
        client.list(cursor="not-a-cursor")
    assert refused.value.status == 400


def test_names_nobody_has_are_not_found(client: trainyard.Client) -> None:
    with pytest.raises(trainyard.NotFound) as missing:
        client.get("no-such-task-zz9")
    assert missing.value.status == 404 and missing.value.code == "not-found"
    assert "no-such-task-zz9" in missing.value.detail
    for call in (client.stop, client.resubmit, client.delete, client.events, client.metrics, client.logs):
        with pytest.raises(trainyard.NotFound):
            call("no-such-task-zz9")
    # The server's own 404 for an id, through the escape hatch.
    with pytest.raises(trainyard.NotFound) as server_said:
        client.request("GET", "/api/v1/tasks/0000000000000000")
    assert server_said.value.type == "https://trainyard.dev/problems/not-found"
    assert server_said.value.title == "Not found"
