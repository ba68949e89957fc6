"""Checks the Python client that openapi-python-client generated from the server's document, against that server.

Imports every module of the package, then uses it as a caller would: who am I, the catalog, a task created from
a document built on that catalog, and the task read back once it runs, its placement's units typed as the
document's tuples say ([spec, resourceType, units]). A metric series (the fake backend records none) goes
through its model and back unchanged. Any exception, or an answer that is not the documented one, fails it.

Usage: check.py DIR URL TOKEN, where DIR holds the package trainyard_api_client.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import time
from typing import Any


def main() -> None:
    where, url, token = sys.argv[1:4]
    sys.path.insert(0, where)
    import trainyard_api_client as pkg

    modules = [m.name for m in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")]
    for name in modules:
        importlib.import_module(name)

    from trainyard_api_client import AuthenticatedClient
    from trainyard_api_client.api.default import create_task, get_catalog, get_task, whoami
    from trainyard_api_client.models import Catalog, MetricSeries, Task, TrainingTask, User

    client = AuthenticatedClient(base_url=url, token=token, raise_on_unexpected_status=True)
    me = whoami.sync(client=client)
    assert isinstance(me, User) and me.role == "admin", me
    catalog = get_catalog.sync(client=client)
    assert isinstance(catalog, Catalog), catalog

    created = create_task.sync(client=client, body=TrainingTask.from_dict(task_document(catalog.to_dict())))
    assert isinstance(created, Task), created
    deadline = time.monotonic() + 30
    while True:
        task = get_task.sync(id=created.id, client=client)
        assert isinstance(task, Task), task
        if task.placement is not None:
            break
        assert time.monotonic() < deadline, f"task {task.id} has no placement after 30 s: {task.status}"
        time.sleep(0.2)
    units = task.placement.units
    assert units and all(
        len(u) == 3 and isinstance(u[0], str) and isinstance(u[1], str) and isinstance(u[2], int) for u in units
    ), units

    series = {"replica": "t-master-0", "name": "loss", "labels": {}, "points": [[1_700_000_000_000, 0.5]]}
    assert MetricSeries.from_dict(series).to_dict() == series

    print(f"python client: {len(modules)} modules imported; task {task.id} {task.status.value}, units {units}")


def task_document(catalog: dict[str, Any]) -> dict[str, Any]:
    """A PyTorchJob for this catalog: the first pool with a spec, its cluster and region, an image with torch."""
    pool_name, pool = next((n, p) for n, p in catalog["pools"].items() if p.get("instanceSpecs"))
    cluster = pool["cluster"]
    image = next(n for n, i in catalog["images"].items() if i.get("torch"))
    return {
        "apiVersion": "trainyard.dev/v1",
        "kind": "TrainingTask",
        "metadata": {"namePrefix": "openapi-client", "projectGroup": next(iter(catalog["projectGroups"]))},
        "spec": {
            "type": "PyTorchJob",
            "placement": {"region": catalog["clusters"][cluster]["region"], "cluster": cluster},
            "environment": {"image": image, "cmd": "python3 train.py"},
            "compute": {
                "resourceType": "Reserved",
                "pool": pool_name,
                "workers": 1,
                "instanceSpecs": [{"spec": pool["instanceSpecs"][0]}],
            },
        },
    }


if __name__ == "__main__":
    main()
