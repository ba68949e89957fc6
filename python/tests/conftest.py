"""A real Trainyard server for the whole session: ``trainyard up`` with the local backend in a throwaway data
dir on a free port, its admin token, and a client for it.

The binary is ``$TRAINYARD_BIN`` (a path relative to the repository root is taken from there), by default the
repository's ``target/debug/trainyard``. The local backend needs root and bubblewrap.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

import trainyard

from helpers import REPO


@dataclass
class Server:
    url: str
    token: str
    data_dir: Path
    log: Path


def _binary() -> Path:
    configured = os.environ.get("TRAINYARD_BIN")
    path = Path(configured) if configured else REPO / "target" / "debug" / "trainyard"
    if not path.is_absolute():
        path = REPO / path
    if not path.is_file():
        pytest.exit(f"no trainyard binary at {path} (build it, or set TRAINYARD_BIN)", returncode=2)
    return path


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return "(no log)"


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    binary = _binary()
    tmp = Path(tempfile.mkdtemp(prefix="trainyard-pytest-"))
    # mkdtemp makes it 0700; the replicas run as uids of their own and must reach their run dirs below it.
    tmp.chmod(0o755)
    data_dir = tmp / "data"
    log = tmp / "server.log"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    # The server reads TRAINYARD_* settings from its environment: none of the caller's leak in.
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINYARD_")}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [str(binary), "up", "--data-dir", str(data_dir), "--listen", f"127.0.0.1:{port}", "--backend", "local"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=tmp,
            start_new_session=True,  # its own process group, ended whole at the end
        )
    try:
        token_file = data_dir / "admin.token"
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                pytest.exit(f"trainyard up exited with {proc.returncode}:\n{_tail(log)}", returncode=2)
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200 and token_file.is_file():
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.exit(f"trainyard up did not answer /healthz within 60 s:\n{_tail(log)}", returncode=2)
            time.sleep(0.2)
        if "backend: local" not in log.read_text(errors="replace"):
            pytest.exit(f"the server did not start the local backend (root and bubblewrap?):\n{_tail(log)}", returncode=2)
        yield Server(url=url, token=token_file.read_text().strip(), data_dir=data_dir, log=log)
    finally:
        _stop_everything(url, data_dir)
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        shutil.rmtree(tmp, ignore_errors=True)


def _stop_everything(url: str, data_dir: Path) -> None:
    """Stops whatever a failed test left running, so that no replica outlives the server."""
    try:
        token = (data_dir / "admin.token").read_text().strip()
        with trainyard.Client(url, token, timeout=10) as c:
            live = [t for t in c.iter_tasks() if not t.is_terminal]
            for t in live:
                try:
                    c.stop(t)
                except trainyard.TrainyardError:
                    pass
            for t in live:
                try:
                    c.wait(t, timeout=15, poll=0.2)
                except trainyard.TrainyardError:
                    pass
    except (OSError, trainyard.TrainyardError):
        pass


@pytest.fixture(scope="session")
def client(server: Server) -> Iterator[trainyard.Client]:
    with trainyard.Client(server.url, server.token, timeout=30) as c:
        yield c


@pytest.fixture
def run(client: trainyard.Client) -> Callable[..., trainyard.Task]:
    """Submits a task and waits (30 s at most) until it ends."""

    def go(spec: trainyard.SpecLike, **submit: Any) -> trainyard.Task:
        t = client.submit(spec, **submit)
        return client.wait(t, timeout=30, poll=0.2)

    return go
