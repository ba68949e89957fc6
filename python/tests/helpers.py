"""What the tests share besides fixtures."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HELLO = REPO / "examples" / "local" / "hello.yaml"


def unique(prefix: str) -> str:
    """A name prefix no other test uses (lowercase letters, digits and hyphens)."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def task_doc(
    prefix: str,
    cmd: str,
    *,
    workers: int = 0,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A PyTorchJob of the `host` image on the local catalog, as a mapping."""
    metadata: dict[str, Any] = {"namePrefix": prefix, "projectGroup": "default"}
    if labels:
        metadata["labels"] = labels
    return {
        "apiVersion": "trainyard.dev/v1",
        "kind": "TrainingTask",
        "metadata": metadata,
        "spec": {
            "type": "PyTorchJob",
            "placement": {"region": "local", "cluster": "local"},
            "environment": {"image": "host", "cmd": cmd},
            "compute": {
                "resourceType": "Reserved",
                "pool": "default",
                "workers": workers,
                "instanceSpecs": [{"spec": "cpu.small"}],
            },
        },
    }
