"""Fills a fresh `trainyard up` with things for the fuzzer to find, then writes what it made as JSON.

Random path parameters almost always name nothing (404), and a random task document almost never fits the
catalog (422), so without this the fuzzer would rarely get past the first check of an operation. This makes,
through the public API: a member user and a token for it, a spare token for each user (one the fuzzer may
revoke), tasks of each user (one stopped, one deleted), a TaskEnv variable each, a registry login and alarm
subscriptions; and it builds task documents that are valid against the server's catalog.

Usage: seed.py URL ADMIN_TOKEN OUT_DIR. Writes OUT_DIR/admin.json and OUT_DIR/member.json (what hooks.py
reads: who the caller is, its own token's id, the known values of each path parameter, valid task documents)
and OUT_DIR/member.token.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import requests

MEMBER = "fuzz-member"


class Api:
    def __init__(self, url: str, token: str) -> None:
        self.url = url.rstrip("/")
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Bearer {token}"

    def call(self, method: str, path: str, expect: int, **kwargs: Any) -> Any:
        r = self.session.request(method, self.url + path, timeout=30, **kwargs)
        if r.status_code != expect:
            sys.exit(f"seed: {method} {path} answered {r.status_code}, not {expect}: {r.text}")
        return r.json() if r.content else None


def task_documents(catalog: dict[str, Any], group: str) -> list[dict[str, Any]]:
    """Valid tasks for this catalog: the first pool with a spec, on its cluster and region, the first image
    that runs each task type (the host image `trainyard up` writes runs PyTorchJob only)."""
    pool_name, pool = next((n, p) for n, p in catalog["pools"].items() if p.get("instanceSpecs"))
    cluster = pool["cluster"]
    region = catalog["clusters"][cluster]["region"]
    docs = []
    for kind, runtime in [("PyTorchJob", "torch"), ("RayJob", "ray")]:
        image = next((n for n, i in catalog["images"].items() if i.get(runtime)), None)
        if image is None:
            continue
        spec: dict[str, Any] = {
            "type": kind,
            "placement": {"region": region, "cluster": cluster},
            "environment": {"image": image, "cmd": "python3 train.py", "env": [{"name": "LR", "value": "3e-4"}]},
            "compute": {
                "resourceType": "Reserved",
                "pool": pool_name,
                "workers": 1,
                "instanceSpecs": [{"spec": pool["instanceSpecs"][0]}],
            },
        }
        docs.append(
            {
                "apiVersion": "trainyard.dev/v1",
                "kind": "TrainingTask",
                "metadata": {"namePrefix": kind.lower(), "projectGroup": group, "labels": {"fuzz": "seed"}},
                "spec": spec,
            }
        )
    return docs


def own_token_id(api: Api, user: str) -> str:
    tokens = api.call("GET", f"/api/v1/users/{user}/tokens", 200)["items"]
    return next(t["id"] for t in tokens if t["current"])


def main() -> None:
    url, admin_token, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    admin = Api(url, admin_token)
    me = admin.call("GET", "/api/v1/whoami", 200)
    catalog = admin.call("GET", "/api/v1/catalog", 200)
    group = next(iter(catalog["projectGroups"]))
    # The member's group may use every image (the host image is for admins unless its entry lists groups).
    for image in catalog["images"].values():
        image["projectGroups"] = [group]
    catalog = admin.call("PUT", "/api/v1/admin/catalog", 200, json=catalog)
    admin.call("POST", "/api/v1/admin/users", 200, json={"name": MEMBER, "role": "member", "groups": [group]})
    member_token = admin.call("POST", f"/api/v1/users/{MEMBER}/tokens", 201, json={"label": "fuzz"})["token"]
    member = Api(url, member_token)

    docs = [d for d in task_documents(catalog, group) if admin.call("POST", "/api/v1/validate", 200, json=d)["valid"]]
    if not docs:
        sys.exit(f"seed: no valid task document for this catalog: {json.dumps(catalog)}")
    ids = []
    for api in (admin, member):
        for n in range(3):
            doc = docs[n % len(docs)]
            ids.append(api.call("POST", "/api/v1/tasks", 201, json=doc)["id"])
    # One stopped and one deleted, so the fuzzer meets ended and deleted tasks as well as live ones.
    admin.call("POST", f"/api/v1/tasks/{ids[0]}/stop", 200)
    member.call("DELETE", f"/api/v1/tasks/{ids[-1]}", 204)
    admin.call("POST", f"/api/v1/tasks/{ids[1]}/shares", 204, json={"user": MEMBER, "operate": True})

    spare = {}
    for name, api in ((me["name"], admin), (MEMBER, member)):
        spare[name] = api.call("POST", f"/api/v1/users/{name}/tokens", 201, json={"label": "spare"})["id"]
        api.call("PUT", f"/api/v1/users/{name}/env", 204, json={"name": "FUZZ_VAR", "value": "x"})
    member.call(
        "PUT",
        f"/api/v1/users/{MEMBER}/alarms",
        204,
        json=[{"events": ["failed"], "webhook": "https://93.184.215.14/hook"}],
    )
    admin.call("PUT", "/api/v1/admin/registries/registry.example:5000/login", 204, json={"username": "u", "password": "p"})

    # A moment for the fake backend to start the live tasks (within about a second), so the fuzzer meets
    # running ones as well as queued ones.
    time.sleep(1.5)
    path = {
        "id": ids,
        "name": [me["name"], MEMBER],
        "user": [me["name"], MEMBER],
        "node": sorted(catalog["nodes"]),
        "host": ["registry.example:5000"],
        "var": ["FUZZ_VAR"],
        # Never the fuzzer's own token: revoking it would end the run (hooks.py guards that too).
        "token": sorted(spare.values()),
    }
    out.mkdir(parents=True, exist_ok=True)
    for role, name, api in (("admin", me["name"], admin), ("member", MEMBER, member)):
        known = {"user": name, "role": role, "tokenId": own_token_id(api, name), "path": path, "tasks": docs}
        (out / f"{role}.json").write_text(json.dumps(known, indent=1))
    (out / "member.token").write_text(member_token)
    print(f"seeded: {len(ids)} tasks, users {me['name']} and {MEMBER}, nodes {', '.join(path['node'])}")


if __name__ == "__main__":
    main()
