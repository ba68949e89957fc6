"""Refusals as typed errors, from the real server's problem documents; configuration from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

import trainyard
from conftest import Server
from helpers import task_doc, unique

BAD = """\
apiVersion: trainyard.dev/v1
kind: TrainingTask
metadata: {namePrefix: Bad_Name, projectGroup: default}
spec:
  type: PyTorchJob
  placement: {region: local, cluster: local}
  environment:
    image: nosuchimage
    cmd: echo hi
    env: [{name: RANK, value: "1"}]
  compute:
    resourceType: Reserved
    pool: default
    workers: -3
    instanceSpecs: [{spec: cpu.huge}]
"""


def test_a_document_with_problems_lists_each_with_its_path(client: trainyard.Client) -> None:
    with pytest.raises(trainyard.ValidationError) as refused:
        client.submit(BAD)
    e = refused.value
    assert isinstance(e, trainyard.ProblemError) and isinstance(e, trainyard.TrainyardError)
    assert e.status == 422 and e.code == "invalid-task"
    assert e.type == "https://trainyard.dev/problems/invalid-task"
    assert e.title and "5 problem" in e.detail
    assert set(e.paths) == {
        "metadata.namePrefix",
        "spec.environment.image",
        "spec.environment.env[0].name",
        "spec.compute.workers",
        "spec.compute.instanceSpecs[0].spec",
    }
    by_path = e.by_path()
    assert by_path["spec.environment.env[0].name"][0].code == "reserved-name"
    assert by_path["spec.compute.workers"][0].code == "out-of-range"
    assert by_path["spec.compute.instanceSpecs[0].spec"][0].code == "not-found"
    assert all(p.severity == "error" and p.message for p in e.problems) and len(e.errors) == 5
    assert "spec.environment.env[0].name" in str(e)
    # The same document as a mapping is refused alike.
    with pytest.raises(trainyard.ValidationError) as as_dict:
        client.submit(yaml.safe_load(BAD))
    assert set(as_dict.value.paths) == set(e.paths)


def test_text_that_does_not_parse_is_a_problem_at_the_document(client: trainyard.Client) -> None:
    with pytest.raises(trainyard.ValidationError) as refused:
        client.submit("a: [\n")
    [problem] = refused.value.problems
    assert problem.path == "" and problem.code == "syntax"


def test_a_bad_or_missing_token_is_unauthorized(server: Server) -> None:
    for token in ("ty_not_a_real_token", None):
        with trainyard.Client(server.url, token) as c:
            with pytest.raises(trainyard.Unauthorized) as refused:
                c.list()
            assert refused.value.status == 401 and refused.value.code == "unauthorized"


def test_what_a_member_may_not_do(client: trainyard.Client, server: Server, run: object) -> None:
    name = unique("member")
    client.request("POST", "/api/v1/admin/users", json_body={"name": name, "role": "member", "groups": ["default"]})
    token = client.request("POST", f"/api/v1/users/{name}/tokens", json_body={"label": "pytest"})["token"]
    admins = client.submit(task_doc(unique("private"), "echo mine"))
    with trainyard.Client(server.url, token) as member:
        me = member.whoami()
        assert (me.name, me.role, me.groups) == (name, "member", ["default"])
        # The `host` image is the server's own file system: admins only, as the local catalog says.
        with pytest.raises(trainyard.Forbidden) as refused:
            member.submit(task_doc(unique("host"), "echo hi"))
        assert refused.value.status == 403 and "host" in refused.value.detail
        with pytest.raises(trainyard.Forbidden):
            member.request("GET", "/api/v1/admin/users")
        # Another user's private task is not there at all, by name or by id.
        with pytest.raises(trainyard.NotFound):
            member.get(admins.name)
        with pytest.raises(trainyard.NotFound):
            member.request("GET", f"/api/v1/tasks/{admins.id}")
        assert member.list_all() == []
    client.wait(admins, timeout=30, poll=0.2)


def test_a_bad_query_is_a_bad_request(client: trainyard.Client) -> None:
    with pytest.raises(trainyard.BadRequest) as refused:
        client.list(sort="sideways")  # type: ignore[arg-type]
    assert refused.value.status == 400 and "sort" in refused.value.detail


def test_an_unreachable_server_is_a_connection_error() -> None:
    with trainyard.Client("http://127.0.0.1:9", "ty_x", timeout=5) as c:
        with pytest.raises(trainyard.TrainyardConnectionError) as failed:
            c.list()
    assert isinstance(failed.value, ConnectionError)
    assert "127.0.0.1:9" in str(failed.value)


def test_from_env(server: Server, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TRAINYARD_SERVER", server.url)
    monkeypatch.setenv("TRAINYARD_TOKEN", server.token)
    monkeypatch.setenv("TRAINYARD_CONFIG", str(tmp_path / "none.yaml"))
    with pytest.raises(FileNotFoundError):  # a config file named outright must be there
        trainyard.Client.from_env()
    monkeypatch.delenv("TRAINYARD_CONFIG")
    monkeypatch.setenv("HOME", str(tmp_path))
    with trainyard.Client.from_env() as c:
        assert c.whoami().name == "admin"

    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"server": server.url, "token": server.token}))
    monkeypatch.delenv("TRAINYARD_SERVER")
    monkeypatch.delenv("TRAINYARD_TOKEN")
    with trainyard.Client.from_env(config=config) as c:
        assert c.url == server.url and c.whoami().role == "admin"
    monkeypatch.setenv("TRAINYARD_TOKEN", "ty_wrong")
    with trainyard.Client.from_env(config=config) as c, pytest.raises(trainyard.Unauthorized):
        c.whoami()  # the environment comes before the file
