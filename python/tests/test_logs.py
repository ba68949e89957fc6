"""Logs: whole, tail, per replica and attempt, and followed live over the server's event stream."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC

import pytest

import trainyard
from helpers import task_doc, unique

Run = Callable[..., trainyard.Task]


def test_follow_sees_lines_as_they_are_written(client: trainyard.Client) -> None:
    cmd = "for i in 1 2 3 4 5 6; do echo tick $i; sleep 0.3; done; echo oops >&2"
    task = client.submit(task_doc(unique("follow"), cmd))
    seen: list[trainyard.LogLine] = []
    status_at_first_line = None
    started = time.monotonic()
    # Followed straight after the submit: the task has not started yet, and is waited for.
    for line in client.logs(task.name, follow=True, poll=0.2):
        if not seen:
            status_at_first_line = client.get(task).status
        seen.append(line)
    took = time.monotonic() - started
    assert [line.text for line in seen] == [f"tick {i}" for i in range(1, 7)] + ["oops"]
    assert status_at_first_line is trainyard.Status.RUNNING  # live, not read after the end
    assert took < 20
    assert [line.stream for line in seen] == ["O"] * 6 + ["E"]
    assert all(line.replica == f"{task.name}-master-0" and line.attempt == 0 for line in seen)
    stamps = [line.time for line in seen if line.time is not None]
    assert len(stamps) == len(seen) and all(s.tzinfo is UTC for s in stamps)
    assert stamps == sorted(stamps)
    # The stream ended with the replica.
    assert client.wait(task, timeout=30, poll=0.2).status is trainyard.Status.SUCCEEDED


def test_tail_replica_and_attempt(client: trainyard.Client, run: Run) -> None:
    done = run(task_doc(unique("tail"), "for i in 1 2 3 4 5; do echo line $i; done", workers=1))
    assert [str(x) for x in client.logs(done, tail=2)] == ["line 4", "line 5"]
    assert list(client.logs(done, tail=0)) == []
    assert len(list(client.logs(done, tail=50))) == 5
    # A followed log of an ended replica: what is there, then the end.
    assert [str(x) for x in client.logs(done, tail=1, follow=True)] == ["line 5"]

    attempts = client.replicas(done)
    assert [a.attempt for a in attempts] == [0]
    assert [(r.name, r.role) for r in attempts[0].replicas] == [
        (f"{done.name}-master-0", "master"),
        (f"{done.name}-worker-0", "worker"),
    ]
    full = f"{done.name}-worker-0"
    assert [x.replica for x in client.logs(done, replica="worker-0")] == [full] * 5
    assert len(list(client.logs(done, replica=full, attempt=0))) == 5
    with pytest.raises(trainyard.NotFound):
        list(client.logs(done, replica="worker-7"))
    with pytest.raises(trainyard.NotFound):
        list(client.logs(done, attempt=3))

    # A new attempt has logs of its own; the first one's stay readable.
    client.resubmit(done)
    again = client.wait(done, timeout=30, poll=0.2)
    assert again.attempt == 1 and again.status is trainyard.Status.SUCCEEDED
    assert [a.attempt for a in client.replicas(done)] == [1, 0]
    assert {x.attempt for x in client.logs(done)} == {1}
    assert {x.attempt for x in client.logs(done, attempt=0)} == {0}


def test_odd_lines_read_and_followed_alike(client: trainyard.Client, run: Run) -> None:
    # A progress bar's carriage returns, an empty line, a form feed and text that is not ASCII.
    cmd = r"printf 'step 1\rstep 2\n\nform\014feed\nnaïve ✓\nno newline at the end'"
    done = run(task_doc(unique("odd"), cmd))
    want = ["step 1\rstep 2", "", "form\x0cfeed", "naïve ✓", "no newline at the end"]
    assert [x.text for x in client.logs(done)] == want
    assert [x.text for x in client.logs(done, follow=True)] == want


def test_a_queued_task_has_no_lines(client: trainyard.Client) -> None:
    # A task that holds all of the group's quota of cpu.small (as many units as the machine has CPUs), and
    # one that waits in the queue behind it.
    quota = client.request("GET", "/api/v1/quota")["items"]
    [units] = [
        int(q["limit"])
        for q in quota
        if (q["group"], q["resourceType"], q["spec"]) == ("default", "Reserved", "cpu.small")
    ]
    if units > 16:
        pytest.skip(f"filling a quota of {units} units takes too many replicas")
    blocker = client.submit(task_doc(unique("blocker"), "sleep 60", workers=units - 1))
    try:
        client.wait(blocker, until="Running", timeout=30, poll=0.2)
        task = client.submit(task_doc(unique("queued"), "echo never"))
        time.sleep(1)  # a few control-loop ticks
        seen = client.get(task)
        assert seen.status is trainyard.Status.QUEUED
        assert seen.queue is not None and seen.queue.position >= 1 and seen.queue.reason
        assert list(client.logs(task)) == []
        assert client.replicas(task) == []
        # Stopped while queued it ends at once, and a followed log of it ends with nothing.
        assert client.stop(task).status is trainyard.Status.STOPPED
        assert list(client.logs(task, follow=True, poll=0.2)) == []
    finally:
        client.stop(blocker)
    assert client.wait(blocker, timeout=30, poll=0.2).status is trainyard.Status.STOPPED
