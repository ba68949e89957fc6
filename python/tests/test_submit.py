"""Submitting in every form the client takes, waiting, stopping, and the check without creating."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

import trainyard
from helpers import HELLO, task_doc, unique

Run = Callable[..., trainyard.Task]


def test_submit_a_mapping_and_wait_until_it_succeeds(client: trainyard.Client, run: Run) -> None:
    prefix = unique("dict")
    submitted = client.submit(task_doc(prefix, "echo from a dict"))
    assert submitted.name.startswith(prefix + "-")
    assert submitted.status is trainyard.Status.QUEUED
    assert submitted.owner == "admin" and submitted.project_group == "default"
    assert submitted.type == "PyTorchJob" and submitted.attempt == 0
    assert submitted.spec is not None and submitted.spec["spec"]["environment"]["cmd"] == "echo from a dict"

    done = client.wait(submitted, timeout=30, poll=0.2)
    assert done.id == submitted.id
    assert done.status == "Succeeded" and done.is_terminal
    assert done.placement is not None
    assert [(r.role, r.index, r.rank) for r in done.placement.replicas] == [("master", 0, 0)]
    assert done.placement.units == [("cpu.small", "Reserved", 1)]
    assert done.updated_at >= done.created_at
    assert [line.text for line in client.logs(done)] == ["from a dict"]


def test_submit_yaml_and_json_text(client: trainyard.Client, run: Run) -> None:
    as_yaml = yaml.safe_dump(task_doc(unique("yaml"), "echo from yaml"))
    assert run(as_yaml).status is trainyard.Status.SUCCEEDED
    as_json = json.dumps(task_doc(unique("json"), "echo from json"))
    done = run(as_json)
    assert done.status is trainyard.Status.SUCCEEDED
    assert [str(line) for line in client.logs(done.name)] == ["from json"]


def test_submit_a_file_by_path_and_by_its_name(client: trainyard.Client, run: Run, tmp_path: Path) -> None:
    # The shipped example: a master and a worker, each printing its rank.
    done = run(HELLO)
    assert done.status is trainyard.Status.SUCCEEDED
    assert done.name.startswith("hello-")
    assert [line.text for line in client.logs(done)] == ["rank 0 of 2"]
    assert [line.text for line in client.logs(done, replica="worker-0")] == ["rank 1 of 2"]

    path = tmp_path / "task.yaml"
    path.write_text(yaml.safe_dump(task_doc(unique("file"), "echo from a file")))
    done = run(str(path))
    assert done.status is trainyard.Status.SUCCEEDED
    assert [line.text for line in client.logs(done)] == ["from a file"]

    with pytest.raises(FileNotFoundError):
        client.submit(str(tmp_path / "missing.yaml"))


def test_an_idempotency_key_makes_a_retry_safe(client: trainyard.Client) -> None:
    key = unique("key")
    doc = task_doc(unique("idem"), "echo once")
    first = client.submit(doc, idempotency_key=key)
    again = client.submit(doc, idempotency_key=key)
    assert again.id == first.id and again.name == first.name
    with pytest.raises(trainyard.Conflict) as refused:
        client.submit(task_doc(unique("idem"), "echo another"), idempotency_key=key)
    assert refused.value.status == 409 and refused.value.code == "conflict"
    assert "Idempotency-Key" in refused.value.detail
    assert client.wait(first, timeout=30, poll=0.2).status is trainyard.Status.SUCCEEDED


def test_a_task_stopped_while_running_ends_stopped(client: trainyard.Client) -> None:
    task = client.submit(task_doc(unique("stop"), "echo started; sleep 60"))
    running = client.wait(task, until="running", timeout=30, poll=0.2)
    assert running.status is trainyard.Status.RUNNING

    with pytest.raises(trainyard.WaitTimeout) as timed_out:
        client.wait(task, timeout=0.5, poll=0.2)
    assert timed_out.value.task.status is trainyard.Status.RUNNING
    assert isinstance(timed_out.value, TimeoutError)

    stopping = client.stop(task.name)
    assert stopping.status in (trainyard.Status.STOPPING, trainyard.Status.STOPPED)
    stopped = client.wait(task, timeout=30, poll=0.2)
    assert stopped.status is trainyard.Status.STOPPED
    reasons = [e.reason for e in client.events(task)]
    assert "StopRequested" in reasons and reasons[-1] == "Terminated"
    # Stopping it again is refused: it has ended.
    with pytest.raises(trainyard.Conflict):
        client.stop(task)


def test_validate_checks_without_creating(client: trainyard.Client) -> None:
    prefix = unique("check")
    good = client.validate(task_doc(prefix, "echo hi"))
    assert good.valid and not [p for p in good.problems if p.severity == "error"]
    assert good.admission is not None and isinstance(good.admission.now, bool)
    assert good.demand and good.task is not None and good.yaml
    bad = client.validate(task_doc("Not_A_Name", "echo hi", workers=-1))
    assert not bad.valid
    assert {p.path for p in bad.problems} >= {"metadata.namePrefix", "spec.compute.workers"}
    assert client.list(search=prefix).items == []
