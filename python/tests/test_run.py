"""``run`` against the real server: a command as a task on what the catalog offers, its output handed back as
it is written (every replica's), and the command's exit status."""

from __future__ import annotations

import asyncio
from pathlib import Path

import trainyard
from conftest import Server
from helpers import unique


def test_a_command_runs_and_its_output_and_exit_code_come_back(client: trainyard.Client, tmp_path: Path) -> None:
    (tmp_path / "answer.py").write_text("print(42)\n")
    seen: list[trainyard.LogLine] = []
    result = client.run(["python3", "answer.py"], workdir=tmp_path, name_prefix=unique("run"), output=seen.append)
    assert (result.status, result.exit_code, result.ok) == (trainyard.Status.SUCCEEDED, 0, True)
    assert [line.text for line in seen] == ["42"]
    assert result.workdir is not None
    spec = client.get(result.task).spec
    assert spec is not None and spec["spec"]["environment"]["workdir"] == result.workdir
    # The catalog's first fit for the admin's group: the CPU spec and the host image.
    assert [s["spec"] for s in spec["spec"]["compute"]["instanceSpecs"]] == ["cpu.small"]
    assert spec["spec"]["environment"]["image"] == "host"

    seen.clear()
    failed = client.run(
        ["python3", "-c", "import sys; print('bye'); sys.exit(3)"], workdir=None, output=seen.append
    )
    assert (failed.status, failed.exit_code) == (trainyard.Status.FAILED, 3)
    assert "exited with code 3" in failed.message and [line.text for line in seen] == ["bye"]


def test_every_replica_is_followed_and_the_async_client_runs_alike(server: Server) -> None:
    async def go() -> tuple[trainyard.RunResult, list[trainyard.LogLine]]:
        seen: list[trainyard.LogLine] = []

        async def take(line: trainyard.LogLine) -> None:
            seen.append(line)

        async with trainyard.AsyncClient(server.url, server.token) as c:
            cmd = 'for i in 1 2; do echo "$RANK says $i"; sleep 0.3; done'
            result = await c.run(cmd, workers=1, workdir=None, name_prefix=unique("arun"), output=take)
        return result, seen

    result, seen = asyncio.run(go())
    assert result.exit_code == 0
    by_replica: dict[str, list[str]] = {}
    for line in seen:
        by_replica.setdefault(line.replica.rsplit("-", 2)[1], []).append(line.text)
    assert by_replica == {"master": ["0 says 1", "0 says 2"], "worker": ["1 says 1", "1 says 2"]}


def test_nothing_that_fits_is_said_before_anything_is_sent(client: trainyard.Client) -> None:
    before = len(client.list_all())
    try:
        client.run(["true"], gpus=64, workdir=None)
    except trainyard.UsageError as e:
        assert "has no quota that fits 64 GPUs a replica" in str(e)
    else:
        raise AssertionError("no UsageError")
    assert len(client.list_all()) == before
