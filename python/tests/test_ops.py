"""What is done to a task once it exists: events, metrics, resubmit, clone and delete."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

import trainyard
from conftest import Server
from helpers import task_doc, unique

Run = Callable[..., trainyard.Task]


def test_events_tell_the_history_in_order(client: trainyard.Client, run: Run) -> None:
    done = run(task_doc(unique("ev"), "echo hi"))
    events = client.events(done.name)
    assert [e.reason for e in events][0] == "Submitted"
    assert {"Admitted", "Started", "Completed"} <= {e.reason for e in events}
    assert events[-1].reason == "Completed"
    seqs = [e.seq for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert all(e.attempt == 0 and e.message for e in events)
    assert all(abs(e.at - done.created_at) < timedelta(minutes=5) for e in events)
    assert client.events(done, after=seqs[-2]) == events[-1:]


# Serves one custom metric in the Prometheus text format for a few seconds.
EXPORTER = """python3 -c '
import http.server, threading, time
class Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"# TYPE train_loss gauge\\ntrain_loss{phase=\\"train\\"} 0.25\\n")
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("0.0.0.0", 9100), Page)
threading.Thread(target=server.serve_forever, daemon=True).start()
print("serving", flush=True)
time.sleep(6)
'"""


def test_metrics_call_shape(client: trainyard.Client, run: Run) -> None:
    doc = task_doc(unique("met"), EXPORTER)
    doc["spec"]["advanced"] = {"metrics": {"endpoints": [{"port": 9100, "path": "/metrics"}], "intervalSeconds": 5}}
    done = run(doc)
    assert done.status is trainyard.Status.SUCCEEDED, [x.text for x in client.logs(done)]
    m = client.metrics(done)
    assert isinstance(m, trainyard.Metrics) and m.attempt == 0
    replica = f"{done.name}-master-0"
    for s in m.series:
        assert s.replica == replica
        assert all(at.tzinfo is UTC and isinstance(v, float) for at, v in s.points)
        assert [at for at, _ in s.points] == sorted(at for at, _ in s.points)
    assert any(s.name.startswith("trainyard_") for s in m.series)  # the preset resource metrics

    [loss] = client.metrics(done.name, name="train_loss").series
    assert (loss.replica, loss.name, loss.labels) == (replica, "train_loss", {"phase": "train"})
    assert loss.points and set(loss.values) == {0.25} and loss.last == 0.25
    assert m.named("train_loss") == [loss]

    assert client.metrics(done, name="no_such_metric").series == []
    assert client.metrics(done, since=datetime.now(UTC) + timedelta(hours=1)).series == []
    later = client.metrics(done, name="train_loss", since=loss.points[-1][0] - timedelta(milliseconds=1)).series
    assert [s.points for s in later] == [loss.points[-1:]]
    assert client.metrics(done, attempt=0).attempt == 0
    with pytest.raises(ValueError, match="time zone"):
        client.metrics(done, since=datetime(2026, 1, 1))  # a naive time is a guess


def test_resubmit_runs_it_again_as_a_new_attempt(client: trainyard.Client, run: Run) -> None:
    done = run(task_doc(unique("again"), "echo hi"))
    queued = client.resubmit(done.name)
    assert queued.id == done.id and queued.attempt == 1
    assert queued.status is trainyard.Status.QUEUED
    with_attempt = client.wait(done, timeout=30, poll=0.2)
    assert with_attempt.status is trainyard.Status.SUCCEEDED and with_attempt.attempt == 1
    events = client.events(done)
    assert "Resubmitted" in [e.reason for e in events]
    assert {e.attempt for e in events} == {0, 1}


def test_clone_makes_a_new_task_from_the_spec(client: trainyard.Client, run: Run) -> None:
    original = run(task_doc(unique("orig"), "echo cloned"))
    copy = client.clone(original.name)
    assert copy.id != original.id and copy.name != original.name
    assert copy.status is trainyard.Status.QUEUED and copy.owner == "admin"
    assert copy.spec is not None and copy.spec["spec"]["environment"]["cmd"] == "echo cloned"
    copy = client.wait(copy, timeout=30, poll=0.2)
    assert copy.status is trainyard.Status.SUCCEEDED
    assert [x.text for x in client.logs(copy)] == ["cloned"]

    again = client.clone(original, project_group="default")
    assert again.project_group == "default"
    client.wait(again, timeout=30, poll=0.2)
    with pytest.raises(trainyard.ValidationError) as refused:
        client.clone(original, project_group="no-such-group")
    assert refused.value.paths == ["metadata.projectGroup"]


def test_delete_takes_it_out_of_lists(client: trainyard.Client, run: Run) -> None:
    done = run(task_doc(unique("del"), "echo bye"))
    client.delete(done.name)
    assert client.list(search=done.name).items == []
    with pytest.raises(trainyard.NotFound):
        client.get(done.name)
    with pytest.raises(trainyard.NotFound):
        client.get(done.id)  # named by a string, it is looked up among the listed tasks, as the CLI does
    # A deleted task is not run again.
    with pytest.raises(trainyard.Conflict) as refused:
        client.resubmit(done)
    assert "deleted" in refused.value.detail
    # What the refusal suggests: a clone runs its spec again (the Task names it by id, with no lookup).
    copy = client.clone(done)
    assert copy.id != done.id
    assert client.wait(copy, timeout=30, poll=0.2).status is trainyard.Status.SUCCEEDED


def test_delete_stops_a_running_task(client: trainyard.Client) -> None:
    task = client.submit(task_doc(unique("delrun"), "sleep 60"))
    client.wait(task, until=[trainyard.Status.RUNNING], timeout=30, poll=0.2)
    client.delete(task)
    ended = client.wait(task, timeout=30, poll=0.2)
    assert ended.status is trainyard.Status.STOPPED
    assert "Deleted" in [e.reason for e in client.events(task)] or "StopRequested" in [
        e.reason for e in client.events(task)
    ]


def test_delete_matching_deletes_every_match_and_needs_a_filter(client: trainyard.Client, run: Run) -> None:
    prefix = unique("bulk")
    done = [run(task_doc(f"{prefix}-{k}", "echo bye")) for k in range(2)]
    other = run(task_doc(unique("keep"), "echo stay"))
    with pytest.raises(ValueError):
        client.delete_matching()
    result = client.delete_matching(search=prefix)
    assert result.deleted == 2 and sorted(result.ids) == sorted(t.id for t in done) and result.failed == []
    assert client.list(search=prefix).items == []
    assert [t.id for t in client.list(search=other.name).items] == [other.id]
    assert client.delete_matching(search=prefix).deleted == 0


def test_share_list_and_take_back(client: trainyard.Client, server: Server, run: Run) -> None:
    name = unique("viewer")
    client.request("POST", "/api/v1/admin/users", json_body={"name": name, "role": "member", "groups": ["default"]})
    token = client.request("POST", f"/api/v1/users/{name}/tokens", json_body={"label": "pytest"})["token"]
    done = run(task_doc(unique("shared"), "echo shared"))
    assert client.shares(done) == []
    with trainyard.Client(server.url, token) as viewer:
        with pytest.raises(trainyard.NotFound):
            viewer.get(done.id)
        client.share(done.name, name)
        assert client.shares(done) == [trainyard.Share(user=name, operate=False)]
        assert viewer.get(done.name).id == done.id
        with pytest.raises(trainyard.Forbidden):
            viewer.resubmit(done)  # seeing is not operating
        with pytest.raises(trainyard.Forbidden):
            viewer.shares(done)  # nor managing its shares
        client.share(done, name, operate=True)
        assert client.shares(done) == [trainyard.Share(user=name, operate=True)]
        client.unshare(done, name)
        with pytest.raises(trainyard.NotFound):
            viewer.get(done.id)
        with pytest.raises(trainyard.NotFound):
            client.unshare(done, name)


def test_clone_under_a_name_prefix_of_its_own(client: trainyard.Client, run: Run) -> None:
    original = run(task_doc(unique("named"), "echo named"))
    copy = client.clone(original, name_prefix="renamed")
    assert copy.name.startswith("renamed-") and copy.id != original.id
    client.wait(copy, timeout=30, poll=0.2)
    with pytest.raises(trainyard.ValidationError) as refused:
        client.clone(original, name_prefix="Not Valid")
    assert refused.value.paths == ["metadata.namePrefix"]


def test_a_deleted_owners_tasks_are_kept_for_the_record(client: trainyard.Client, server: Server) -> None:
    name = unique("leaver")
    # An admin account, since the local catalog's only image (`host`) is for admins; deleting one is the same.
    client.request("POST", "/api/v1/admin/users", json_body={"name": name, "role": "admin", "groups": ["default"]})
    token = client.request("POST", f"/api/v1/users/{name}/tokens", json_body={"label": "pytest"})["token"]
    with trainyard.Client(server.url, token) as leaver:
        task = leaver.submit(task_doc(unique("left"), "sleep 60"))
        assert task.owner == name and not task.owner_deleted and not task.deleted
        leaver.wait(task, until=[trainyard.Status.RUNNING], timeout=30, poll=0.2)
        client.request("POST", f"/api/v1/admin/users/{name}/delete", json_body={"queued": "hold", "running": "stop"})
        with pytest.raises(trainyard.Unauthorized):
            leaver.get(task.id)  # their tokens went with the account
    ended = client.wait(task, timeout=60, poll=0.2)
    assert ended.status is trainyard.Status.STOPPED
    assert ended.owner == name and ended.owner_deleted and not ended.deleted
    assert [t.id for t in client.list(owner=name).items] == [task.id]
