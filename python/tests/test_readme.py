"""The README's example runs as written."""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from conftest import Server
from helpers import REPO


def test_the_readme_example_runs(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Python client") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the README's Python client section has an example"
    monkeypatch.setenv("TRAINYARD_SERVER", server.url)
    monkeypatch.setenv("TRAINYARD_TOKEN", server.token)
    monkeypatch.chdir(REPO)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(match.group(1), "README.md", "exec"), {})
    printed = out.getvalue()
    assert "rank 1 of 2" in printed
    assert "metadata.namePrefix required" in printed and "spec.compute required" in printed, printed
