"""Working directories: a local directory packed into a manifest as the CLI packs it (``trainyard submit
--workdir``), and uploaded as a plan (see ``_plan``): the manifest checked, only the files the server lacks
sent as tar streams named by their SHA-256, then the manifest kept. The same tree sent again sends no file.

A manifest's entries are ``{path, kind: dir|file|link, sha256, size, executable, target}``; its id is the
SHA-256 of the entries' JSON in path order, written as the server writes it, so that this client and the CLI
name the same tree alike (``_ignore`` says which paths stay home).
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import stat
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ._ignore import IGNORE_FILE, Rules
from ._plan import Plan, blocking, build, json_of, send
from .errors import ProblemError, WorkdirError

# Most bytes of files one upload request carries (a larger file goes alone), as the CLI sends them.
BATCH_BYTES = 32 << 20
_READ_CHUNK = 1 << 16


@dataclass(frozen=True, slots=True)
class Entry:
    """One entry of a manifest: a directory, a file (its content's SHA-256 and size, and whether its owner may
    run it) or a link to a relative path inside the directory."""

    path: str
    kind: str
    sha256: str | None = None
    size: int = 0
    executable: bool = False
    target: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The entry as the server writes it: fields at their default left out, in the server's order."""
        d: dict[str, Any] = {"path": self.path, "kind": self.kind}
        if self.sha256 is not None:
            d["sha256"] = self.sha256
        if self.size:
            d["size"] = self.size
        if self.executable:
            d["executable"] = True
        if self.target is not None:
            d["target"] = self.target
        return d


@dataclass(slots=True)
class Packed:
    """A packed directory: its entries in walk order, and where each digest's content is on this machine."""

    directory: Path
    entries: list[Entry] = field(default_factory=list)
    sources: dict[str, bytes] = field(default_factory=dict)

    @property
    def id(self) -> str:
        return manifest_id(self.entries)

    @property
    def bytes(self) -> int:
        return sum(e.size for e in self.entries)

    def manifest(self) -> dict[str, Any]:
        return {"entries": [e.to_json() for e in self.entries]}


def manifest_id(entries: Sequence[Entry]) -> str:
    """A working directory's id: the SHA-256 of its entries' JSON, sorted by path (byte order, which is the
    order of code points), compact and with non-ASCII text as it is, as the server's ``serde_json`` writes it."""
    ordered = sorted(entries, key=lambda e: e.path)
    text = json.dumps([e.to_json() for e in ordered], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


# --- packing ----------------------------------------------------------------------------------------------


def _shown(name: bytes) -> str:
    """A path for a message, as Rust's ``Path::display`` shows it (bytes that are not UTF-8 as U+FFFD)."""
    return name.decode("utf-8", errors="replace")


def _quoted(text: str) -> str:
    """``text`` as Rust's ``{:?}`` writes a string."""
    out = []
    for c in text:
        if c in ('"', "\\"):
            out.append("\\" + c)
        elif c == "\n":
            out.append("\\n")
        elif c == "\r":
            out.append("\\r")
        elif c == "\t":
            out.append("\\t")
        elif c == "\0":
            out.append("\\0")
        elif ord(c) < 0x20 or ord(c) == 0x7F:
            out.append(f"\\u{{{ord(c):x}}}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def _link_problem(path: str, target: str) -> str | None:
    """Why a link at ``path`` to ``target`` may not travel (it leaves the directory), or ``None``."""
    if not target:
        return "has an empty target"
    if target.startswith("/"):
        return f"links to {_quoted(target)}, an absolute path; a link may lead only inside the directory"
    at = path.split("/")[:-1]
    for p in target.split("/"):
        if p in ("", "."):
            continue
        if p == "..":
            if not at:
                return f"links to {_quoted(target)}, outside the directory"
            at.pop()
        else:
            at.append(p)
    return None


def _hash(path: bytes) -> tuple[str, int, bool]:
    """A file's SHA-256, size, and whether its owner may run it."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        executable = bool(os.fstat(f.fileno()).st_mode & stat.S_IXUSR)
        while chunk := f.read(_READ_CHUNK):
            size += len(chunk)
            h.update(chunk)
    return h.hexdigest(), size, executable


def _os_error(e: OSError) -> str:
    """An OS error as Rust's ``io::Error`` writes it."""
    if e.errno is not None and e.strerror:
        return f"{e.strerror} (os error {e.errno})"
    return str(e)


def pack(directory: str | os.PathLike[str]) -> Packed:
    """Packs ``directory`` as the CLI does: every entry git would keep (see ``_ignore``), ``.git`` left out,
    each file hashed, links kept as links, in the order of a walk with each directory's names sorted.
    Raises :class:`WorkdirError` naming every problem at once: a link that is absolute or leads out of the
    directory, a special file (a socket, FIFO or device), a name that is not UTF-8, a file that cannot be read.
    """
    root = Path(directory)
    raw_root = os.fsencode(root)
    try:
        if not stat.S_ISDIR(os.stat(raw_root).st_mode):
            raise WorkdirError(root, [f"{root}: not a directory"])
    except OSError as e:
        raise WorkdirError(root, [f"{root}: {_os_error(e)}"]) from e
    root_parts = tuple(p for p in os.path.realpath(raw_root).split(b"/") if p)
    packed = Packed(directory=root)
    problems: list[str] = []
    _walk(raw_root, (), Rules.above(os.path.realpath(raw_root)).enter(raw_root, ()), root_parts, packed, problems)
    if problems:
        raise WorkdirError(root, problems)
    return packed


def _walk(
    here: bytes,
    parts: tuple[bytes, ...],
    rules: Rules,
    root_parts: tuple[bytes, ...],
    packed: Packed,
    problems: list[str],
) -> None:
    try:
        with os.scandir(here) as it:
            children = sorted(it, key=lambda d: d.name)
    except OSError as e:
        problems.append(f"{_shown(b'/'.join(parts) or b'.')}: {_os_error(e)}")
        return
    for child in children:
        rel = (*parts, child.name)
        try:
            is_dir = child.is_dir(follow_symlinks=False)
            is_link = child.is_symlink()
            is_file = child.is_file(follow_symlinks=False)
        except OSError as e:
            problems.append(f"{_shown(b'/'.join(rel))}: {_os_error(e)}")
            continue
        if rules.ignored(rel, is_dir, root_parts) or child.name == b".git":
            continue
        raw_path = b"/".join(rel)
        try:
            path = raw_path.decode("utf-8")
        except UnicodeDecodeError:
            path = None
            problems.append(f"{_shown(raw_path)}: the name is not UTF-8; rename it or list it in {IGNORE_FILE}")
        if path is not None:
            entry = _entry(child.path, path, is_dir, is_link, is_file, packed, problems)
            if entry is not None:
                packed.entries.append(entry)
        if is_dir:
            # As the CLI's walk does, a directory is walked even when its own name is refused.
            _walk(child.path, rel, rules.enter(child.path, rel), root_parts, packed, problems)


def _entry(
    full: bytes, path: str, is_dir: bool, is_link: bool, is_file: bool, packed: Packed, problems: list[str]
) -> Entry | None:
    if is_dir:
        return Entry(path, "dir")
    if is_link:
        try:
            raw_target = os.readlink(full)
        except OSError as e:
            problems.append(f"{path}: {_os_error(e)}")
            return None
        try:
            target = raw_target.decode("utf-8")
        except UnicodeDecodeError:
            problems.append(f"{path}: a link whose target is not UTF-8")
            return None
        why = _link_problem(path, target)
        if why is not None:
            problems.append(f"{path}: a link that {why}; list it in {IGNORE_FILE} to leave it out")
            return None
        return Entry(path, "link", target=target)
    if is_file:
        try:
            digest, size, executable = _hash(full)
        except OSError as e:
            problems.append(f"{path}: {_os_error(e)}")
            return None
        packed.sources.setdefault(digest, full)
        return Entry(path, "file", sha256=digest, size=size, executable=executable)
    problems.append(f"{path}: a special file (a socket, FIFO or device) cannot travel; list it in {IGNORE_FILE}")
    return None


# --- sending ----------------------------------------------------------------------------------------------


def batches(packed: Packed, missing: Sequence[str], batch_bytes: int = BATCH_BYTES) -> list[list[str]]:
    """The digests in ``missing`` in batches of about ``batch_bytes`` each (a larger file alone), in order."""
    sizes = {e.sha256: e.size for e in packed.entries if e.sha256 is not None}
    out: list[list[str]] = []
    at = 0
    while at < len(missing):
        batch: list[str] = []
        total = 0
        while at < len(missing) and (not batch or total < batch_bytes):
            batch.append(missing[at])
            total += sizes.get(missing[at], 0)
            at += 1
        out.append(batch)
    return out


def tar_of(packed: Packed, digests: Sequence[str]) -> bytes:
    """A tar stream of these files, each a regular file named by its digest. A file whose content is no
    longer its digest (it changed since it was packed) is a :class:`WorkdirError`: nothing of it is sent."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for digest in digests:
            src = packed.sources.get(digest)
            if src is None:
                raise WorkdirError(
                    packed.directory, [f"the server asked for {digest}, which this directory does not hold"]
                )
            try:
                with open(src, "rb") as f:
                    data = f.read()
            except OSError as e:
                raise WorkdirError(packed.directory, [f"{_shown(src)}: {_os_error(e)}"]) from e
            if hashlib.sha256(data).hexdigest() != digest:
                raise WorkdirError(
                    packed.directory, [f"{_shown(src)} changed while it was being sent; upload again"]
                )
            info = tarfile.TarInfo(digest)
            info.size = len(data)
            info.mode = 0o644
            info.type = tarfile.REGTYPE
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def upload(directory: str | os.PathLike[str], group: str) -> Plan[str]:
    """Packs and uploads ``directory`` for ``group``; returns its id."""
    if not isinstance(group, str) or not group:
        raise ValueError("a working directory is uploaded for a project group: name one")
    packed = yield from blocking(functools.partial(pack, directory))
    body = json.dumps({"projectGroup": group, "manifest": packed.manifest()}, ensure_ascii=False).encode()
    headers = {"Content-Type": "application/json"}
    check = json_of((yield from send("POST", "/api/v1/workdirs/check", content=body, headers=headers)))
    missing: list[str] = build(lambda d: [str(x) for x in d["missing"]], check)
    path = "/api/v1/workdirs/blobs?projectGroup=" + quote(group, safe="")
    for digests in batches(packed, missing):
        tar = yield from blocking(functools.partial(tar_of, packed, digests))
        try:
            yield from send("POST", path, content=tar, headers={"Content-Type": "application/x-tar"})
        except ProblemError as e:
            if "SHA-256 is another" in e.detail:
                raise WorkdirError(packed.directory, ["a file changed while it was sent; upload again"]) from e
            raise
    # A check that found every file kept the working directory already.
    kept = check.get("workdir") if isinstance(check, dict) else None
    if not (isinstance(kept, dict) and not missing):
        kept = json_of((yield from send("POST", "/api/v1/workdirs", content=body, headers=headers)))
    workdir_id: str = build(lambda d: str(d["id"]), kept)
    return workdir_id
