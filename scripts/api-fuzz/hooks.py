"""Schemathesis hooks for scripts/test-api-fuzz: point generated requests at things that exist, and keep the
fuzzer from locking itself out.

$TRAINYARD_API_FUZZ_KNOWN is the JSON seed.py wrote for the caller of this pass. With it:

- Path parameters are half the time what the fuzzer generated and half the time a value that exists (a task,
  a user, a node, a registry, a TaskEnv variable, a spare token), so operations get past their 404.
- A task document (create, validate) is half the time generated from the schema and half the time one that
  fits the server's catalog, varied, so tasks are created and the document's links from createTask lead to
  real tasks. A share names an existing user half the time.
- Two requests that would end the run are changed just before they are sent: revoking the caller's own
  token (swapped for an id no token has) and an admin saving their own user with another role (the role
  kept). Both are legitimate requests that the server rightly obeys; disabling or deleting oneself needs no
  guard, the server refuses it (409). Deleting the seeded member (the admin's pass may) leaves its later
  operations on that user answering their documented 404s.

Everything is drawn through Hypothesis, so a run's seed replays it.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import schemathesis
from hypothesis import strategies as st

KNOWN: dict[str, Any] = json.loads(Path(os.environ["TRAINYARD_API_FUZZ_KNOWN"]).read_text())


def _operation_id(case: Any) -> str | None:
    return case.operation.definition.raw.get("operationId")


@schemathesis.hook
def flatmap_path_parameters(context: Any, path_parameters: Any) -> st.SearchStrategy:
    if not isinstance(path_parameters, dict):
        return st.just(path_parameters)
    known: dict[str, list[str]] = KNOWN["path"]
    return st.fixed_dictionaries(
        {
            name: st.one_of(st.just(value), st.sampled_from(known[name])) if known.get(name) else st.just(value)
            for name, value in path_parameters.items()
        }
    )


@st.composite
def _task_document(draw: st.DrawFn) -> dict[str, Any]:
    doc = copy.deepcopy(draw(st.sampled_from(KNOWN["tasks"])))
    metadata = doc["metadata"]
    metadata["namePrefix"] = draw(st.from_regex(r"\A[a-z][a-z0-9-]{0,30}[a-z0-9]\Z"))
    metadata["public"] = draw(st.booleans())
    metadata["labels"] = draw(
        st.dictionaries(st.from_regex(r"\A[a-z][a-z0-9]{0,8}\Z"), st.from_regex(r"\A[a-z0-9]{0,8}\Z"), max_size=3)
    )
    compute = doc["spec"]["compute"]
    compute["workers"] = draw(st.integers(min_value=1, max_value=2))
    compute["resourceType"] = draw(st.sampled_from(["Reserved", "Reserved", "Spot", "Ondemand", "Idle"]))
    return doc


@schemathesis.hook("flatmap_body").apply_to(operation_id=["createTask", "validateTask"])
def fitting_task_documents(context: Any, body: Any) -> st.SearchStrategy:
    return st.one_of(st.just(body), _task_document())


@schemathesis.hook("flatmap_body").apply_to(operation_id="shareTask")
def existing_users(context: Any, body: Any) -> st.SearchStrategy:
    """A share names a user that must exist (else 400): half the time one that does."""
    if not isinstance(body, dict):
        return st.just(body)
    return st.one_of(st.just(body), st.sampled_from(KNOWN["path"]["user"]).map(lambda u: {**body, "user": u}))


@schemathesis.hook
def before_call(context: Any, case: Any, kwargs: Any) -> None:
    op = _operation_id(case)
    if op == "revokeToken":
        token = case.path_parameters.get("token")
        if isinstance(token, str) and token.lower() == KNOWN["tokenId"].lower():
            case.path_parameters["token"] = "0" * len(token)
    elif op == "saveUser" and isinstance(case.body, dict) and case.body.get("name") == KNOWN["user"]:
        case.body = {**case.body, "role": KNOWN["role"]}
