"""Working directories against the real server: a project goes with a 1+1 PyTorchJob to both replicas without
what git ignores, the same tree sent again sends no file, its id is the CLI's for the same tree, and a tree
that cannot go is refused before anything is sent."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

import trainyard
from conftest import Server, _binary
from helpers import task_doc, unique
from trainyard._workdir import manifest_id, pack

CHECK = """\
import os
import mypkg
rank = os.environ["RANK"]
assert os.getcwd() == "/workspace", os.getcwd()
for home in ("old.ckpt", "secret.txt", ".git", "data/scratch.tmp"):
    assert not os.path.exists(home), home
assert open("data/keep.ckpt").read() == "kept", "a nested !pattern brings a file back"
print(f"rank {rank}: {mypkg.GREETING}; total {mypkg.total('data/numbers.txt')}", flush=True)
"""


def write(root: Path, rel: str, text: str) -> None:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def project(root: Path) -> Path:
    """A package, a data file, a script, and what git would leave out (a nested .gitignore brings one back)."""
    root.mkdir(parents=True, exist_ok=True)
    write(root, "mypkg/__init__.py", "from .numbers import total\nGREETING = 'hello from the working directory'\n")
    write(root, "mypkg/numbers.py", "def total(path):\n    return sum(int(x) for x in open(path).read().split())\n")
    write(root, "data/numbers.txt", "1 2 3 4 5 6 7 8 9 10\n")
    write(root, "check.py", CHECK)
    write(root, ".gitignore", "*.ckpt\nsecret.txt\n")
    write(root, "old.ckpt", "a checkpoint that stays home")
    write(root, "secret.txt", "stays home")
    write(root, "data/.gitignore", "!keep.ckpt\n*.tmp\n")
    write(root, "data/keep.ckpt", "kept")
    write(root, "data/scratch.tmp", "stays home")
    write(root, ".git/HEAD", "ref: refs/heads/main\n")
    os.symlink("mypkg/numbers.py", root / "numbers-link.py")
    return root


def counter(server: Server, name: str) -> int:
    text = httpx.get(f"{server.url}/metrics", headers={"Authorization": f"Bearer {server.token}"}).text
    for line in text.splitlines():
        if line.startswith(name + " "):
            return int(float(line.split()[1]))
    raise AssertionError(f"no {name} in /metrics")


def workdirs(client: trainyard.Client) -> set[str]:
    return {w["id"] for w in client.request("GET", "/api/v1/workdirs", params={"projectGroup": "default"})["items"]}


def cli(server: Server, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    env |= {"TRAINYARD_SERVER": server.url, "TRAINYARD_TOKEN": server.token, "TRAINYARD_CONFIG": "/dev/null"}
    return subprocess.run([str(_binary()), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)


def test_a_project_goes_to_both_replicas_once_and_is_named_as_the_cli_names_it(
    client: trainyard.Client, server: Server, tmp_path: Path
) -> None:
    proj = project(tmp_path / "proj")
    packed = pack(proj)
    assert [e.path for e in packed.entries] == [
        ".gitignore",
        "check.py",
        "data",
        "data/.gitignore",
        "data/keep.ckpt",
        "data/numbers.txt",
        "mypkg",
        "mypkg/__init__.py",
        "mypkg/numbers.py",
        "numbers-link.py",
    ]
    link = next(e for e in packed.entries if e.kind == "link")
    assert (link.path, link.target) == ("numbers-link.py", "mypkg/numbers.py")

    received = counter(server, "trainyard_workdir_received_files_total")
    task = client.submit(task_doc(unique("wd"), "python3 check.py", workers=1), workdir=proj)
    wd = task.spec["spec"]["environment"]["workdir"] if task.spec else None
    assert wd == packed.id == manifest_id(packed.entries)
    # Every file went, each digest once (the link is a link).
    assert counter(server, "trainyard_workdir_received_files_total") - received == len(packed.sources) == 7
    done = client.wait(task, timeout=60, poll=0.2)
    got = {line.text for r in ("master-0", "worker-0") for line in client.logs(done, replica=r)}
    assert done.status is trainyard.Status.SUCCEEDED, got
    assert got == {f"rank {r}: hello from the working directory; total 55" for r in (0, 1)}

    # The same tree again, from both clients: no file is sent, the id is the same.
    received = counter(server, "trainyard_workdir_received_files_total")
    assert client.upload_workdir(proj, "default") == wd

    async def again() -> str:
        async with trainyard.AsyncClient(server.url, server.token) as c:
            return await c.upload_workdir(proj, "default")

    assert asyncio.run(again()) == wd
    assert counter(server, "trainyard_workdir_received_files_total") == received

    # The CLI names the same tree alike (and has nothing to send either).
    (proj / "task.json").write_text(json.dumps(task_doc(unique("wd-cli"), "true")))
    (proj / ".trainyardignore").write_text("task.json\n")
    ours = client.upload_workdir(proj, "default")
    out = cli(server, proj, "submit", "-f", "task.json", "--workdir", ".", "-o", "json")
    assert out.returncode == 0, out.stderr
    theirs = json.loads(out.stdout)["spec"]["spec"]["environment"]["workdir"]
    assert theirs == ours != wd and ours in workdirs(client)
    assert "sent 0 files" in out.stderr, out.stderr


def test_a_tree_that_cannot_go_is_refused_before_anything_is_sent(
    client: trainyard.Client, server: Server, tmp_path: Path
) -> None:
    proj = project(tmp_path / "bad")
    os.symlink("/etc/passwd", proj / "passwords")
    os.symlink("../../outside", proj / "mypkg" / "up")
    os.mkfifo(proj / "pipe")
    (proj / os.fsdecode(b"caf\xe9.py")).write_text("x")
    # What an ignore file lists is not looked at.
    os.mkfifo(proj / "ignored.ckpt")
    received = counter(server, "trainyard_workdir_received_files_total")
    kept = workdirs(client)
    before = client.list_all(group="default")
    with pytest.raises(trainyard.WorkdirError) as refused:
        client.submit(task_doc(unique("bad"), "true"), workdir=proj)
    said = str(refused.value)
    assert "nothing was sent, 4 things to mend first" in said, said
    assert refused.value.problems == [
        "caf\ufffd.py: the name is not UTF-8; rename it or list it in .trainyardignore",
        'mypkg/up: a link that links to "../../outside", outside the directory; list it in .trainyardignore '
        "to leave it out",
        'passwords: a link that links to "/etc/passwd", an absolute path; a link may lead only inside the '
        "directory; list it in .trainyardignore to leave it out",
        "pipe: a special file (a socket, FIFO or device) cannot travel; list it in .trainyardignore",
    ]
    assert isinstance(refused.value, ValueError)

    async def refused_async() -> None:
        async with trainyard.AsyncClient(server.url, server.token) as c:
            with pytest.raises(trainyard.WorkdirError):
                await c.upload_workdir(proj, "default")

    asyncio.run(refused_async())
    assert counter(server, "trainyard_workdir_received_files_total") == received
    assert workdirs(client) == kept and len(client.list_all(group="default")) == len(before)

    # The CLI says the same of it.
    (tmp_path / "task.json").write_text(json.dumps(task_doc(unique("bad-cli"), "true")))
    out = cli(server, proj, "submit", "-f", str(tmp_path / "task.json"), "--workdir", ".")
    assert out.returncode == 2, out.stderr
    for problem in refused.value.problems[1:]:
        assert problem.split(";")[0] in out.stderr, out.stderr


def test_a_document_without_a_group_cannot_take_a_working_directory(client: trainyard.Client, tmp_path: Path) -> None:
    doc = task_doc(unique("nogroup"), "true")
    del doc["metadata"]["projectGroup"]
    with pytest.raises(trainyard.UsageError, match="metadata.projectGroup"):
        client.submit(doc, workdir=tmp_path)
